"""LangChain (langchain-huggingface): HuggingFaceEmbeddings around the contextual model.

HuggingFaceEmbeddings builds its own SentenceTransformer from ``model_name``; giving it ``model_name=""`` and the
contextual model's modules makes it use those very modules, so the context set on ``model`` is the one it uses.
Without ``encode_kwargs``/``query_encode_kwargs`` it calls plain ``encode()``: no query or document prompt.
"""

from _common import CORPUS, QUERIES, load_model, missing_client

try:
    from langchain_huggingface import HuggingFaceEmbeddings
except ModuleNotFoundError as err:  # the `clients` extra is not part of a plain install
    raise SystemExit(missing_client(err, "langchain-huggingface")) from None

model = load_model()
model.set_context(CORPUS, seed=0)  # before handing the model over; later set_context calls apply too

embeddings = HuggingFaceEmbeddings(
    model_name="",  # no folder to load: the modules below
    model_kwargs={"modules": list(model), "prompts": model.prompts, "device": str(model.device)},
    encode_kwargs={"prompt_name": "document"},  # embed_documents: "search_document: "
    query_encode_kwargs={"prompt_name": "query"},  # embed_query: "search_query: "
)
doc_vectors = embeddings.embed_documents(CORPUS)
query_vector = embeddings.embed_query(QUERIES[0])
print(len(doc_vectors), len(query_vector))
