"""Which published mteb task a local folder is a copy of: the shared folders' twins (:data:`MTEB_TWINS`) and, for
any other folder, a look-up in mteb's own task registry by name (:func:`registry_twin`).

A local copy of a published task is scored as that task (same evaluator, main score, splits and settings), so its
scores compare with the published ones.
"""

from __future__ import annotations

import functools
import logging
import re

from cde_st.evaluation.local_folders import KIND_TO_MTEB_TYPE

logger = logging.getLogger(__name__)

# mteb (and datasets) are imported inside the functions that use them: importing mteb takes seconds, and
# ``import cde_st.evaluation`` (and the in-training evaluators) must not pay for it.

#: Local folder name -> (published mteb task whose definition it reproduces, hf subset of that task).
MTEB_TWINS: dict[str, tuple[str, str]] = {
    "scifact": ("SciFact", "default"),
    "stsbenchmark": ("STSBenchmark", "default"),
    "sts12": ("STS12", "default"),
    "sts13": ("STS13", "default"),
    "sts14": ("STS14", "default"),
    "sickr": ("SICK-R", "default"),
    "biosses": ("BIOSSES", "default"),
    "banking77": ("Banking77Classification", "default"),
    "amazon_counterfactual_en": ("AmazonCounterfactualClassification", "en"),
    "tweet_sentiment_extraction": ("TweetSentimentExtractionClassification", "default"),
    "twentynewsgroups": ("TwentyNewsgroupsClustering", "default"),
    "twitterurlcorpus": ("TwitterURLCorpus", "default"),
}

#: Twins whose mteb split is made of several original splits, joined from the local files that exist. mteb's SICK-R
#: "test" is the whole SICK corpus (9,927 pairs = train 4,500 + trial 500 + test 4,927); mteb's TwitterURLCorpus
#: "test" is the whole Twitter URL corpus (51,534 pairs = train 42,200 + test 9,324 of Lan et al., 2017). Local
#: folders keep the original splits.
TWIN_SPLIT_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "sickr": {"test": ("train", "trial", "test")},
    "twitterurlcorpus": {"test": ("train", "test")},
}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.lru_cache(maxsize=1)
def _registry_index() -> tuple[tuple[str, str, str, str, bool, tuple[str, ...]], ...]:
    """(name, dataset name, type, superseded_by, multilingual, subsets) of every task in mteb's registry (the tasks
    ``mteb.get_tasks(exclude_superseded=False)`` gives)."""
    import mteb
    from mteb.get_tasks import TASK_LIST

    rows = []
    # The task classes' metadata, as mteb.get_tasks filters them: get_tasks would also build every task (a seeded
    # torch RNG each, seconds for the whole registry), and the metadata is all this index reads.
    for task in mteb.filter_tasks(TASK_LIST, exclude_superseded=False, exclude_private=True, exclude_beta=True):
        meta = task.metadata
        path = str((meta.dataset or {}).get("path", ""))
        rows.append(
            (
                meta.name,
                path.rstrip("/").rsplit("/", 1)[-1],
                meta.type,
                meta.superseded_by or "",
                meta.is_multilingual,
                tuple(meta.hf_subsets),
            )
        )
    return tuple(rows)


def registry_twin(folder_name: str, kind: str) -> tuple[str, str] | None:
    """The published mteb task a local folder named ``folder_name`` is a copy of, from mteb's own registry.

    A task of the folder's type matches when its name or its dataset's name (``mteb/arguana`` -> ``arguana``) equals
    the folder name, ignoring case (then also ignoring ``-``, ``_`` and dots); task names win over dataset names
    and tasks that are not superseded over superseded ones. Returns ``(task name, hf subset)``, or ``None`` when
    nothing (or nothing unambiguous) matches; a multilingual task matches only with one subset.

    Example:
        >>> registry_twin("arguana", "retrieval")  # doctest: +SKIP
        ('ArguAna', 'default')
    """
    wanted_type = KIND_TO_MTEB_TYPE.get(kind)
    rows = [r for r in _registry_index() if r[2] == wanted_type]
    for field, same in (
        (0, lambda a, b: a.lower() == b.lower()),
        (0, lambda a, b: _normalise(a) == _normalise(b)),
        (1, lambda a, b: a.lower() == b.lower()),
        (1, lambda a, b: _normalise(a) == _normalise(b)),
    ):
        found = [r for r in rows if r[field] and same(r[field], folder_name)]
        current = [r for r in found if not r[3]] or found
        if not current:
            continue
        if len(current) > 1:
            logger.warning(
                "Local folder %r matches several mteb tasks (%s); scoring it as a generic %s task. Choose one with "
                "load_local_task(..., twin=NAME).",
                folder_name,
                ", ".join(r[0] for r in current),
                kind,
            )
            return None
        name, _, _, _, multilingual, subsets = current[0]
        if multilingual and len(subsets) != 1:
            logger.warning(
                "Local folder %r matches the multilingual mteb task %s; name its subset with twin='%s:<subset>' "
                "(one of %s). Scoring it as a generic %s task.",
                folder_name,
                name,
                name,
                ", ".join(subsets),
                kind,
            )
            return None
        return name, subsets[0] if multilingual else "default"
    return None
