"""Embedding a whole corpus with one context: streaming readers, the corpus context, resumable shards, the index.

``embed_corpus`` (the ``cde-st-embed`` command) reads a corpus as a stream, samples its context in one pass (or
takes a given one), embeds it in parquet shards with a manifest, and builds a faiss index; ``search_index`` (the
``cde-st-search`` command) searches it with the same model and context. See docs/embedding_corpora.md.
"""

from cde_st.corpus.context_sample import BottomKSample
from cde_st.corpus.corpus_context import CorpusContext, read_context_file
from cde_st.corpus.job import embed_corpus, finished_shards
from cde_st.corpus.manifest import ForeignOutputError, read_manifest
from cde_st.corpus.readers import CorpusBatch, CorpusReader
from cde_st.corpus.shards import DamagedFileError, read_shard

__all__ = [
    "BottomKSample",
    "CorpusBatch",
    "CorpusContext",
    "CorpusReader",
    "DamagedFileError",
    "ForeignOutputError",
    "embed_corpus",
    "finished_shards",
    "read_context_file",
    "read_manifest",
    "read_shard",
]
