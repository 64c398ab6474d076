"""Context pools: which documents of an (already loaded) mteb task the context is sampled from.

==================================  ==========================================================================
task type                           pool
==================================  ==========================================================================
Retrieval, Reranking, ...           the corpus of the split (``title + " " + text``, as mteb feeds documents);
                                    never the queries
Classification (+ multilabel)       the texts of the train split (the classifier's training data)
Clustering                          the texts to cluster
STS, pair classification, bitext    the task's own texts, both columns
Summarization                       the source texts and all human and machine summaries
==================================  ==========================================================================

Pools are read from ``task.dataset`` as mteb loaded it (never reloaded), deduplicated in first-seen order (the
context is a set of documents; a sentence repeated across pairs must not weigh more), blank strings dropped: the
rule of :func:`cde_st.context.context_documents`, which ``set_context`` and the in-training evaluators follow too.
:class:`ContextPlan` then samples the context once per task/subset/split with :func:`cde_st.context.sample_context`
(seeded, without replacement) and caches it, so a task's queries and documents, its train and test encodings,
and every chunk of a corpus all see the same context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cde_st.context import distinct_documents, fingerprint_texts, sample_context
from cde_st.data import column, document_text

logger = logging.getLogger(__name__)

# mteb (and datasets) are imported inside the functions that use them: importing mteb takes seconds, and
# ``import cde_st.evaluation`` (and the in-training evaluators) must not pay for it.

#: Context modes of the evaluation kit.
CONTEXT_MODES = ("corpus", "random", "none")


def _texts(values: Iterable[Any]) -> Iterator[str]:
    for value in values:
        if isinstance(value, str):
            yield value
        elif isinstance(value, (list, tuple)):  # clustering sets, v1 single-row pair layouts, summaries
            yield from _texts(value)


def unique_texts(values: Iterable[Any]) -> list[str]:
    """Strings of ``values`` (nested lists flattened) as a set of documents, by the rule every context follows
    (:func:`cde_st.context.distinct_documents`): deduplicated in first-seen order, blank ones dropped."""
    return distinct_documents(_texts(values))


def _subset_data(task: Any, hf_subset: str) -> Any:
    dataset = task.dataset
    if dataset is None:
        raise RuntimeError(f"Task {task.metadata.name} has no loaded data to take the context from.")
    if hf_subset in dataset:
        return dataset[hf_subset]
    if hf_subset == "default":
        return dataset
    raise KeyError(f"Task {task.metadata.name} has no loaded subset {hf_subset!r}.")


def corpus_texts(corpus: Any) -> list[str]:
    """Document texts of a retrieval corpus (a ``datasets.Dataset`` with ``text`` and optional ``title``), see
    :func:`cde_st.data.document_text`."""
    texts = column(corpus, "text")
    titles = column(corpus, "title") if "title" in corpus.column_names else [None] * len(texts)
    return [document_text(title, text) for title, text in zip(titles, texts)]


def pool_split(task: Any, hf_split: str) -> str:
    """The split whose data is the pool for encodings of ``hf_split``: the train split for classification (its
    train and test encodings share one context), the split itself otherwise."""
    from mteb.abstasks.classification import AbsTaskClassification

    if isinstance(task, AbsTaskClassification):
        return task.train_split
    return hf_split


def context_pool(task: Any, hf_subset: str, hf_split: str) -> list[str]:
    """The documents of a loaded mteb task that the context of (``hf_subset``, ``hf_split``) is sampled from.

    See the module docstring for the pool of each task type.
    """
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.abstasks.clustering import AbsTaskClustering
    from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy
    from mteb.abstasks.pair_classification import AbsTaskPairClassification
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.text.summarization import AbsTaskSummarization

    data = _subset_data(task, hf_subset)
    if isinstance(task, AbsTaskRetrieval):
        pool = unique_texts(corpus_texts(data[hf_split]["corpus"]))
    elif isinstance(task, AbsTaskClassification):
        name = task.input_column_name
        pool = unique_texts(column(data[task.train_split], name)) if isinstance(name, str) else []
    elif isinstance(task, (AbsTaskClustering, AbsTaskClusteringLegacy)):
        name = task.input_column_name
        pool = unique_texts(column(data[hf_split], name)) if isinstance(name, str) else []
    elif isinstance(task, AbsTaskSTS):
        split = data[hf_split]
        pool = unique_texts(v for c in task.column_names if isinstance(c, str) for v in column(split, c))
    elif isinstance(task, AbsTaskPairClassification):
        split = data[hf_split]
        columns = [c for c in (task.input1_column_name, task.input2_column_name) if isinstance(c, str)]
        pool = unique_texts(v for c in columns for v in column(split, c))
    elif isinstance(task, AbsTaskSummarization):
        split = data[hf_split]
        columns = (task.text_column_name, task.human_summaries_column_name, task.machine_summaries_column_name)
        pool = unique_texts(v for c in columns for v in column(split, c))
    else:  # bitext mining, regression, ...: every text column of the split
        split = data[hf_split]
        pool = unique_texts(v for c in split.column_names for v in column(split, c))
    if not pool:
        raise ValueError(
            f"Task {task.metadata.name} ({type(task).__name__}, subset {hf_subset}, split {hf_split}) has no text "
            "to build a context pool from."
        )
    return pool


@dataclass(frozen=True)
class ContextChoice:
    """The context chosen for one task/subset/split: the sampled documents and where they came from."""

    key: tuple[str, str, str]
    texts: list[str]
    seed: int
    source: str
    pool_size: int

    @property
    def fingerprint(self) -> str:
        return fingerprint_texts(self.texts)


@dataclass
class ContextPlan:
    """Chooses (and caches) the context of every task/subset/split of a run.

    Args:
        mode: ``"corpus"`` (the task's own pool), ``"random"`` (documents from another corpus, see
            ``random_pool``) or ``"none"`` (no context).
        size: number of context documents J (0: no context).
        seed: sampling seed; the same (pool, J, seed) always gives the same documents.
        random_pool: for ``mode="random"``: a function ``task_name -> foreign documents`` (see
            :func:`cde_st.evaluation.runner.evaluate_model` for the default: the other tasks' pools, or a fixed
            corpus).

    Tasks must be registered (:meth:`register`) before their first encode call; the pool is read lazily from the
    task's loaded data at that call.
    """

    mode: str = "corpus"
    size: int = 0
    seed: int = 0
    random_pool: Callable[[str], Sequence[str]] | None = None
    tasks: dict[str, Any] = field(default_factory=dict)
    _cache: dict[tuple[str, str, str], ContextChoice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in CONTEXT_MODES:
            raise ValueError(f"Unknown context mode {self.mode!r}; choose one of {CONTEXT_MODES}.")
        if self.size < 0:
            raise ValueError(f"Context size must be >= 0, got {self.size}.")
        if self.mode == "random" and self.random_pool is None:
            raise ValueError("Context mode 'random' needs a random_pool (documents from another corpus).")

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.size > 0

    def register(self, task: Any) -> None:
        self.tasks[task.metadata.name] = task

    def choose(self, task_name: str, hf_subset: str, hf_split: str) -> ContextChoice | None:
        """The context for an encode call of ``task_name`` on (``hf_subset``, ``hf_split``); ``None`` when inactive."""
        if not self.active:
            return None
        task = self.tasks.get(task_name)
        if task is None:
            raise KeyError(
                f"Task {task_name!r} was not registered with the context plan; its context pool is unknown. "
                "Run tasks through cde_st.evaluation.evaluate_model."
            )
        key = (task_name, hf_subset, pool_split(task, hf_split))
        if key not in self._cache:
            if self.mode == "corpus":
                pool, source = context_pool(task, hf_subset, key[2]), f"corpus:{task_name}/{hf_subset}/{key[2]}"
            else:
                assert self.random_pool is not None
                pool, source = list(self.random_pool(task_name)), f"random-for:{task_name}"
            texts = sample_context(pool, self.size, self.seed)
            self._cache[key] = ContextChoice(key, texts, self.seed, source, len(pool))
            logger.info(
                "Context for %s: %d of %d documents (%s, seed %d)", key, self.size, len(pool), source, self.seed
            )
        return self._cache[key]

    @property
    def choices(self) -> list[ContextChoice]:
        return list(self._cache.values())
