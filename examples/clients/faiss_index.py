"""faiss: index encode_document outputs, search with encode_query (both given the corpus context)."""

import faiss
from _common import CORPUS, QUERIES, load_model

model = load_model()
model.set_context(CORPUS, seed=0)

docs = model.encode_document(CORPUS, normalize_embeddings=True)  # float32 (6, d); normalised: inner product = cosine
index = faiss.IndexFlatIP(docs.shape[1])
index.add(docs)
# Keep the context's fingerprint with the index: queries must be encoded with the same context as the documents.
index_context = model.context_info.fingerprint

assert model.context_info.fingerprint == index_context, "the model's context changed since the index was built"
queries = model.encode_query(QUERIES, normalize_embeddings=True)
scores, ids = index.search(queries, 2)
for query, row, row_scores in zip(QUERIES, ids, scores):
    print(query, "->", [(CORPUS[i][:30], round(float(s), 3)) for i, s in zip(row, row_scores)])
