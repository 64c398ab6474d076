"""LlamaIndex (llama-index-embeddings-huggingface): HuggingFaceEmbedding around the contextual model.

HuggingFaceEmbedding builds its own SentenceTransformer; ``model_name=""`` plus the contextual model's modules
(passed through as a SentenceTransformer argument) makes it use those modules and their context. It encodes queries
with prompt "query" and texts with prompt "text": give both as instructions, or documents get no prompt.
"""

from _common import CORPUS, QUERIES, load_model, missing_client

try:
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
except ModuleNotFoundError as err:  # the `clients` extra is not part of a plain install
    raise SystemExit(missing_client(err, "llama-index-embeddings-huggingface")) from None

model = load_model()
model.set_context(CORPUS, seed=0)

embed_model = HuggingFaceEmbedding(
    model_name="",  # no folder to load: the modules below
    modules=list(model),
    query_instruction=model.prompts["query"],  # "search_query: "
    text_instruction=model.prompts["document"],  # "search_document: " (LlamaIndex calls documents "text")
    device=str(model.device),
)
doc_vectors = embed_model.get_text_embedding_batch(CORPUS)
query_vector = embed_model.get_query_embedding(QUERIES[0])
print(len(doc_vectors), len(query_vector))
