"""Embedding a whole corpus with one context: streaming readers, the corpus context, resumable shards, the index.

``embed_corpus`` (the ``cde-st-embed`` command) reads a corpus as a stream, samples its context in one pass (or
takes a given one), embeds it in parquet shards with a manifest, and builds a faiss index; ``search_index`` (the
``cde-st-search`` command) searches it with the same model and context. ``update_corpus`` (``--update``) brings the
folder up to date with its corpus under the recorded context, ``recontextualize_corpus`` (``--recontextualize``)
embeds it again with a new one, and ``corpus_drift`` (``--drift``) says how far the corpus has moved from the
documents its context was made from. See docs/embedding_corpora.md.
"""

from cde_st.context import BottomKSample
from cde_st.corpus.corpus_context import CorpusContext, context_path, read_context_file
from cde_st.corpus.drift import Drift, corpus_drift
from cde_st.corpus.job import embed_corpus, finished_shards
from cde_st.corpus.manifest import ForeignOutputError, read_manifest
from cde_st.corpus.readers import CorpusBatch, CorpusReader
from cde_st.corpus.shards import DamagedFileError, read_shard
from cde_st.corpus.update import recontextualize_corpus, update_corpus

__all__ = [
    "BottomKSample",
    "CorpusBatch",
    "CorpusContext",
    "CorpusReader",
    "DamagedFileError",
    "Drift",
    "ForeignOutputError",
    "context_path",
    "corpus_drift",
    "embed_corpus",
    "finished_shards",
    "read_context_file",
    "read_manifest",
    "read_shard",
    "recontextualize_corpus",
    "update_corpus",
]
