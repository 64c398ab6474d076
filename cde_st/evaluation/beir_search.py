"""beir's exact dense search for contextual (and plain) sentence-transformers models: :class:`ContextualExactSearch`.

beir evaluates a dense model with ``EvaluateRetrieval(DenseRetrievalExactSearch(model))``, whose ``search`` encodes the
queries before the corpus. A contextual model embeds every text against a context of corpus documents, so that
context must come from the corpus *before any query is encoded*; :class:`ContextualExactSearch` sets it first, the
way the evaluation kit (:func:`cde_st.evaluation.evaluate_model`) does for an mteb retrieval task:

- the pool is the corpus, each document read as ``title + " " + text``
  (:func:`cde_st.data.document_text`), deduplicated in corpus order;
- J documents are sampled from it with :func:`cde_st.context.sample_context` (seeded, without replacement);
- task prefixes are on for a contextual model (queries ``search_query: ``, documents and context documents
  ``search_document: ``; :class:`cde_st.evaluation.TaskPrefixes`) and off for a plain one, which then uses its own
  ``query`` / ``document`` prompts.

With the same J and seed, a contextual model therefore gets the same context and the same scores as from
``eval/run_mteb.py`` on the same BEIR folder. Scoring, ranking and beir's own rule for identical query/document ids
(beir's search never returns a document whose id is the query's id) are beir's, unchanged.

Needs beir: ``pip install 'cde_st[beir]'``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from beir.retrieval.search.dense import DenseRetrievalExactSearch
except ImportError as err:  # beir is an optional extra
    raise ImportError(
        "cde_st.evaluation.beir_search needs the beir package: pip install 'cde_st[beir]' (or pip install beir)."
    ) from err

from cde_st.context import check_seed, sample_context
from cde_st.data import document_text
from cde_st.evaluation.model_context import clear_model_context, context_sizes, is_contextual_model, set_model_context
from cde_st.evaluation.pools import unique_texts
from cde_st.evaluation.prefixes import TaskPrefixes

logger = logging.getLogger(__name__)

__all__ = ["ContextualExactSearch"]


def _corpus_documents(corpus: list[dict[str, str]] | Mapping[str, Mapping[str, str]]) -> list[str]:
    """beir corpus entries (``{"title": ..., "text": ...}``, as a list or an id-keyed dict) as document texts."""
    entries = corpus.values() if isinstance(corpus, Mapping) else corpus
    return [document_text(entry.get("title"), entry.get("text") or "") for entry in entries]


class _BeirEncoder:
    """The ``encode_queries`` / ``encode_corpus`` interface beir's search calls, over a sentence-transformers model:
    the kit's prefixes (or none: the model's own query/document prompts) and its document rule."""

    def __init__(self, model: Any, prefixes: TaskPrefixes | None) -> None:
        self.model = model
        self.prefixes = prefixes

    def _prompt(self, role: str) -> str | None:
        return self.prefixes.for_inputs("Retrieval", role) if self.prefixes is not None else None

    def encode_queries(self, queries: list[str], batch_size: int = 32, **kwargs: Any) -> Any:
        return self.model.encode_query(queries, prompt=self._prompt("query"), batch_size=batch_size, **kwargs)

    def encode_corpus(self, corpus: list[dict[str, str]], batch_size: int = 32, **kwargs: Any) -> Any:
        documents = _corpus_documents(corpus)
        return self.model.encode_document(documents, prompt=self._prompt("document"), batch_size=batch_size, **kwargs)


class ContextualExactSearch(DenseRetrievalExactSearch):
    """beir's ``DenseRetrievalExactSearch`` for a sentence-transformers model, contextual or plain: before any query
    is encoded, a contextual model's context is set from the corpus being searched (and cleared afterwards).

    Args:
        model: a ``SentenceTransformer``; a CDE ``ContextualSentenceTransformer`` gets its context from the corpus,
            any other model is searched as it is (no context).
        batch_size, corpus_chunk_size, kwargs: as for beir's ``DenseRetrievalExactSearch``.
        context_size: J, the number of corpus documents in the context (default: the model's context slots; fewer
            leave the other slots null; 0 is the null context). Ignored for a plain model.
        context_seed: seed of the context sampling.
        prefixes: ``True`` / ``False`` to force the task prefixes on or off, or a :class:`TaskPrefixes` (default: on
            for a contextual model, off for a plain one, as in the evaluation kit).

    After a search, ``context_log`` says which context was used (size, seed, pool size, prompt, fingerprint).

    Example:
        >>> from beir.datasets.data_loader import GenericDataLoader  # doctest: +SKIP
        >>> from beir.retrieval.evaluation import EvaluateRetrieval  # doctest: +SKIP
        >>> corpus, queries, qrels = GenericDataLoader("scifact").load(split="test")  # doctest: +SKIP
        >>> retriever = EvaluateRetrieval(ContextualExactSearch(model, context_size=64), score_function="cos_sim")
        ... # doctest: +SKIP
        >>> ndcg, *_ = retriever.evaluate(qrels, retriever.retrieve(corpus, queries), retriever.k_values)
        ... # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        batch_size: int = 128,
        corpus_chunk_size: int = 50000,
        *,
        context_size: int | None = None,
        context_seed: int = 0,
        prefixes: bool | TaskPrefixes | None = None,
        **kwargs: Any,
    ) -> None:
        if not (hasattr(model, "encode_query") and hasattr(model, "encode_document")):
            raise TypeError(
                f"ContextualExactSearch takes a sentence-transformers model, got {type(model).__name__}; pass the "
                "SentenceTransformer itself (not a beir models.SentenceBERT wrapper)."
            )
        check_seed(context_seed, "context_seed")
        self.contextual = is_contextual_model(model)
        self.context_size = context_sizes(model, self.contextual, "corpus", context_size)[0]
        self.context_seed = context_seed
        if isinstance(prefixes, TaskPrefixes):
            self.prefixes: TaskPrefixes | None = prefixes
        else:
            self.prefixes = TaskPrefixes() if (self.contextual if prefixes is None else prefixes) else None
        self.encoder = model
        self.context_log: list[dict[str, Any]] = []
        super().__init__(_BeirEncoder(model, self.prefixes), batch_size, corpus_chunk_size, **kwargs)

    @contextmanager
    def corpus_context(self, corpus: Mapping[str, Mapping[str, str]]) -> Iterator[None]:
        """Within the block, the model's context is J documents sampled from ``corpus`` (a contextual model
        only); the context is cleared afterwards."""
        if not self.contextual:
            yield
            return
        prompt = self.prefixes.for_context("Retrieval") if self.prefixes is not None else ""
        pool = unique_texts(_corpus_documents(corpus))
        texts = sample_context(pool, self.context_size, self.context_seed) if self.context_size else []
        try:
            if texts:
                info = set_model_context(self.encoder, texts, self.context_seed, prompt, batch_size=self.batch_size)
                fingerprint = info.fingerprint
            else:
                clear_model_context(self.encoder)
                fingerprint = None
            entry = {
                "size": len(texts),
                "seed": self.context_seed,
                "pool_size": len(pool),
                "prompt": prompt,
                "fingerprint": fingerprint,
            }
            self.context_log.append(entry)
            logger.info(
                "Context for the beir search: %d of %d corpus documents (seed %d)",
                len(texts),
                len(pool),
                self.context_seed,
            )
            with warnings.catch_warnings():
                if not texts:  # the null context is what was asked for
                    warnings.filterwarnings("ignore", message="No context is set", category=UserWarning)
                yield
        finally:
            clear_model_context(self.encoder)

    def search(
        self,
        corpus: dict[str, dict[str, str]],
        queries: dict[str, str],
        top_k: int,
        score_function: str,
        return_sorted: bool = False,
        **kwargs: Any,
    ) -> dict[str, dict[str, float]]:
        with self.corpus_context(corpus):
            return super().search(corpus, queries, top_k, score_function, return_sorted=return_sorted, **kwargs)

    def encode(self, corpus: dict[str, dict[str, str]], queries: dict[str, str], *args: Any, **kwargs: Any) -> None:
        """beir's ``encode`` (``EvaluateRetrieval.encode_and_retrieve``) with the corpus context set first."""
        with self.corpus_context(corpus):
            return super().encode(corpus, queries, *args, **kwargs)
