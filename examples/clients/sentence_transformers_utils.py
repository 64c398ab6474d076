"""sentence-transformers utilities on a contextual model: model.similarity and util.semantic_search."""

from _common import CORPUS, QUERIES, load_model
from sentence_transformers import util

model = load_model()
model.set_context(CORPUS, seed=0)  # the corpus you search is the context: set it before encoding

doc_emb = model.encode_document(CORPUS, convert_to_tensor=True)  # "search_document: " + context
query_emb = model.encode_query(QUERIES, convert_to_tensor=True)  # "search_query: " + context
print(model.similarity(query_emb, doc_emb).shape)  # (2, 6), the model's similarity function

hits = util.semantic_search(query_emb, doc_emb, top_k=2, score_function=util.cos_sim)
for query, query_hits in zip(QUERIES, hits):
    print(query, "->", [(CORPUS[h["corpus_id"]][:30], round(h["score"], 3)) for h in query_hits])
