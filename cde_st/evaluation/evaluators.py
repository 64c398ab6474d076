"""In-training evaluation of contextual models: every evaluator scores with a corpus context, never the null one.

A contextual model evaluated without a context is a plain bi-encoder (the null context), so a stock
sentence-transformers evaluator would score it, and pick the best checkpoint, on the wrong model. Here:

- :class:`ContextualRetrievalEvaluator`: a BEIR folder scored with its own corpus as context (seeded sample of
  ``context_size`` documents, document prompt), as the MTEB kit does it. Scoring is sentence-transformers'
  ``InformationRetrievalEvaluator`` (NDCG@10 is the main score). Final numbers come from ``eval/run_mteb.py``.
- :class:`ContextualEvaluator`: any sentence-transformers evaluator run with a given corpus as context.
- :func:`with_corpus_context`: what the trainer does with the evaluator it is given: context-aware evaluators
  pass, a stock ``InformationRetrievalEvaluator`` is wrapped with its own corpus (with a warning), anything else
  that cannot give the model a context is refused.

Each sets the context for the call only and restores the model's previous context afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from sentence_transformers.sentence_transformer.evaluation import (
    BinaryClassificationEvaluator,
    EmbeddingSimilarityEvaluator,
    InformationRetrievalEvaluator,
    SentenceEvaluator,
    SequentialEvaluator,
)

from cde_st.context import ContextInfo, context_documents, sample_context
from cde_st.data import load_beir
from cde_st.evaluation.model_context import set_model_context
from cde_st.model import context_prompt, contextual_module, is_contextual

logger = logging.getLogger(__name__)


@contextmanager
def corpus_context(
    model: Any, corpus: Sequence[str], context_size: int | None = None, seed: int = 0, batch_size: int = 32
) -> Iterator[ContextInfo | None]:
    """Within the ``with`` block, ``model``'s context is ``context_size`` documents of ``corpus``
    (:func:`cde_st.context.sample_context`, seeded; ``None``: the model's J; fewer than J leave the other slots
    null; 0 is the null context), prefixed with the model's document prompt. The previous context is restored
    afterwards. Yields the :class:`ContextInfo` (``None`` for a non-contextual model, which is left alone).

    Example:
        >>> with corpus_context(model, corpus_texts, context_size=64, seed=0):  # doctest: +SKIP
        ...     scores = stock_evaluator(model)
    """
    if not is_contextual(model):
        yield None
        return
    module = contextual_module(model)
    slots = module.context_size
    size = slots if context_size is None else context_size
    if not 0 <= size <= slots:
        raise ValueError(f"context_size={size} must be between 0 and the model's {slots} context slots.")
    prompt = context_prompt(model)
    previous = module.context_snapshot()
    was_training = module.training
    try:
        # The corpus as a set of documents (the rule of set_context and of the eval kit's pools), so that the
        # evaluator and cde-st-eval sample the same context from the same corpus.
        documents = context_documents(corpus)
        if size == slots:  # J documents: set_context samples them from the corpus and records them
            info = module.set_context(documents, seed=seed, prompt=prompt, batch_size=batch_size)
        else:  # fewer: the sampled documents fill `size` slots, the others stay null
            texts = sample_context(documents, size, seed) if size else []
            info = set_model_context(model, texts, seed=seed, prompt=prompt, batch_size=batch_size)
            info.corpus_size = len(documents)
        yield info
    finally:
        module.restore_context(previous)
        module.train(was_training)


class ContextualRetrievalEvaluator(InformationRetrievalEvaluator):
    """Retrieval evaluator for a BEIR folder (``corpus.jsonl[.gz]``, ``queries.jsonl``, ``qrels/{split}.tsv``)
    that scores a contextual model with ``context_size`` documents of the evaluated corpus as its context.

    Args:
        folder: the BEIR folder.
        split: which qrels file to score.
        max_corpus: keep the judged documents plus a seeded sample of the others up to this many (faster,
            optimistic scores); ``None`` keeps the whole corpus.
        seed: context sampling (and corpus subsampling) seed.
        context_size: documents of the context, sampled from the (possibly subsampled) corpus with
            :func:`cde_st.context.sample_context`; ``None`` uses the model's J, fewer leave the other slots null.
        name, batch_size, kwargs: as for ``InformationRetrievalEvaluator``.

    Example:
        >>> evaluator = ContextualRetrievalEvaluator("path/to/data/retrieval/scifact", context_size=64)  # doctest: +SKIP
        >>> evaluator(model)["scifact_cosine_ndcg@10"]                                                  # doctest: +SKIP
    """

    def __init__(
        self,
        folder: str | Path,
        split: str = "test",
        max_corpus: int | None = None,
        seed: int = 0,
        name: str | None = None,
        batch_size: int = 32,
        context_size: int | None = None,
        **kwargs,
    ) -> None:
        if context_size is not None and (isinstance(context_size, bool) or not isinstance(context_size, int)):
            raise TypeError(f"context_size must be an int or None, got {context_size!r}.")
        if context_size is not None and context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {context_size}.")
        data = load_beir(folder, split)
        corpus = data.document_texts()
        queries = data.queries
        relevant = {q: {d for d, s in rel.items() if s > 0} for q, rel in data.qrels.items()}
        if max_corpus is not None and max_corpus < len(corpus):
            judged = set().union(*relevant.values()) & set(corpus)
            others = sorted(set(corpus) - judged)
            rng = np.random.default_rng(seed)
            keep = judged | set(rng.choice(others, size=max(0, max_corpus - len(judged)), replace=False).tolist())
            corpus = {i: corpus[i] for i in corpus if i in keep}
        self.seed = seed
        self.context_size = context_size
        super().__init__(
            queries=queries,
            corpus=corpus,
            relevant_docs=relevant,
            name=name or Path(folder).name,
            batch_size=batch_size,
            **kwargs,
        )

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        with corpus_context(model, self.corpus, self.context_size, self.seed, batch_size=self.batch_size):
            return super().__call__(model, output_path, epoch, steps)

    def get_config_dict(self) -> dict[str, Any]:
        return {**super().get_config_dict(), "context_size": self.context_size, "context_seed": self.seed}


def check_scorable(evaluator: SentenceEvaluator) -> None:
    """Raise ``ValueError`` when ``evaluator``'s data cannot give a score: an ``EmbeddingSimilarityEvaluator`` with
    fewer than two pairs, a gold score that is NaN or infinite, or one gold score for all (Spearman undefined), a ``BinaryClassificationEvaluator`` whose
    pairs all have one label (average precision undefined). The message names the evaluator and says why."""
    name = f"{type(evaluator).__name__} {getattr(evaluator, 'name', '')!r}"
    if isinstance(evaluator, EmbeddingSimilarityEvaluator):
        scores = list(evaluator.scores)
        if len(scores) < 2:
            raise ValueError(f"{name}: {len(scores)} pair(s); a Spearman correlation needs at least two pairs.")
        bad = next((i for i, s in enumerate(scores) if not np.isfinite(s)), None)
        if bad is not None:  # one NaN gold score makes the correlation, and so the score, NaN
            raise ValueError(
                f"{name}: pair {bad} has the gold score {scores[bad]!r}; every gold score must be a finite number "
                "(fix or remove that pair)."
            )
        if len(set(scores)) < 2:
            raise ValueError(f"{name}: every pair has the score {scores[0]!r}; a correlation needs differing scores.")
    elif isinstance(evaluator, BinaryClassificationEvaluator):
        labels = set(evaluator.labels)
        if len(labels) < 2:
            raise ValueError(
                f"{name}: every pair has the label {next(iter(labels), None)!r}; average precision needs pairs of "
                "both labels (0 and 1)."
            )


class ContextualEvaluator(SentenceEvaluator):
    """Any sentence-transformers evaluator, run with ``context_size`` documents of ``corpus`` as the model's
    context (see :func:`corpus_context`). ``primary_metric`` and ``greater_is_better`` are the wrapped evaluator's,
    so checkpoint selection works as with the evaluator itself.

    Example:
        >>> sts = EmbeddingSimilarityEvaluator(s1, s2, scores)                                # doctest: +SKIP
        >>> evaluator = ContextualEvaluator(sts, corpus=s1 + s2, context_size=64, seed=0)      # doctest: +SKIP
    """

    def __init__(
        self, evaluator: SentenceEvaluator, corpus: Sequence[str], context_size: int | None = None, seed: int = 0
    ) -> None:
        self.evaluator = evaluator
        # a mapping ({id: text}) gives its texts, as for set_context
        self.corpus = list(corpus.values()) if isinstance(corpus, Mapping) else list(corpus)
        self.context_size = context_size
        self.seed = seed
        if not self.corpus:
            raise ValueError("ContextualEvaluator needs a non-empty corpus to sample the context from.")
        check_scorable(evaluator)

    @property
    def primary_metric(self) -> str | None:
        return getattr(self.evaluator, "primary_metric", None)

    @primary_metric.setter
    def primary_metric(self, value: str | None) -> None:
        self.evaluator.primary_metric = value

    @property
    def greater_is_better(self) -> bool:
        return getattr(self.evaluator, "greater_is_better", True)

    @greater_is_better.setter
    def greater_is_better(self, value: bool) -> None:
        self.evaluator.greater_is_better = value

    @property
    def description(self) -> str:
        return self.evaluator.description

    def __call__(self, model, output_path: str | None = None, epoch: int = -1, steps: int = -1):
        with corpus_context(model, self.corpus, self.context_size, self.seed):
            return self.evaluator(model, output_path, epoch, steps)

    def get_config_dict(self) -> dict[str, Any]:
        return {**self.evaluator.get_config_dict(), "context_size": self.context_size, "context_seed": self.seed}


def with_corpus_context(
    evaluator: SentenceEvaluator | None, model: Any, context_size: int | None = None, seed: int = 0
) -> SentenceEvaluator | None:
    """``evaluator`` made safe for ``model``: unchanged for a non-contextual model or a context-aware evaluator
    (:class:`ContextualRetrievalEvaluator`, :class:`ContextualEvaluator`); a stock ``InformationRetrievalEvaluator``
    is wrapped to use its own corpus as context (with a warning); a ``SequentialEvaluator``'s members are treated
    the same way; any other evaluator raises ``TypeError`` (wrap it in :class:`ContextualEvaluator` with the
    corpus whose context it should see)."""
    if evaluator is None or not is_contextual(model):
        return evaluator
    if isinstance(evaluator, (ContextualRetrievalEvaluator, ContextualEvaluator)):
        return evaluator
    if isinstance(evaluator, SequentialEvaluator):
        members = [with_corpus_context(e, model, context_size, seed) for e in evaluator.evaluators]
        return SequentialEvaluator(members, main_score_function=evaluator.main_score_function)
    if isinstance(evaluator, InformationRetrievalEvaluator):
        logger.warning(
            "%s scores a contextual model with the null context (no context: a plain bi-encoder); wrapping it so "
            "that it samples the context from its own corpus (%d documents, seed %d). Use "
            "cde_st.evaluation.ContextualRetrievalEvaluator to choose this explicitly.",
            type(evaluator).__name__,
            len(evaluator.corpus),
            seed,
        )
        return ContextualEvaluator(evaluator, evaluator.corpus, context_size=context_size, seed=seed)
    raise TypeError(
        f"{type(evaluator).__name__} would score the contextual model with the null context (a plain bi-encoder) "
        "and checkpoints would be chosen on that. Wrap it: "
        "cde_st.evaluation.ContextualEvaluator(evaluator, corpus=TEXTS, context_size=J), or use "
        "cde_st.evaluation.ContextualRetrievalEvaluator for retrieval."
    )
