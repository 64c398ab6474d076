"""Tasks of an evaluation run: a task object, a local folder or an mteb task name resolved to an mteb task
(:func:`resolve_task`), and its data loaded with errors that say what to do (:func:`load_task_data`).

Local folders win over mteb names (``scifact`` is the local copy, ``SciFact`` the mteb hub task).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cde_st.data import check_relevance_judgements, column
from cde_st.evaluation.identical_ids import apply_identical_ids
from cde_st.evaluation.local_folders import find_local_task, list_local_tasks
from cde_st.evaluation.local_tasks import load_local_task


class UnknownTaskError(ValueError):
    """A task name that is neither a local folder nor an mteb task."""


class TaskDataError(RuntimeError):
    """A task's data could not be loaded (e.g. an mteb hub dataset while offline)."""


def resolve_task(
    task: Any,
    data_dir: str | Path | None = None,
    eval_splits: Sequence[str] | None = None,
    identical_ids: str = "auto",
):
    """An mteb task from a task object, a local folder (path, or name under ``data_dir``) or an mteb task name.

    Local folders win over mteb names (``scifact`` is the local copy, ``SciFact`` the mteb hub task).
    ``identical_ids`` (retrieval): ``"auto"`` keeps an mteb task's own rule for query ids that are also corpus ids
    (for local folders that are no mteb task: decided from the texts, see
    :func:`~cde_st.evaluation.identical_ids.queries_are_documents`); ``"ignore"`` / ``"keep"`` force it.

    Raises:
        UnknownTaskError: with the local tasks found and the closest mteb names.
    """
    # mteb is imported on use: importing it takes seconds
    import mteb
    from mteb.abstasks.abstask import AbsTask

    if isinstance(task, AbsTask):
        return apply_identical_ids(task, identical_ids)
    spec = str(task)
    folder = find_local_task(spec, data_dir)
    if folder is not None:
        return load_local_task(folder, eval_splits=eval_splits, identical_ids=identical_ids)
    try:
        hub_task = mteb.get_task(spec)
    except KeyError:
        local = list_local_tasks(data_dir)
        names = [t.metadata.name for t in mteb.get_tasks()]
        close = difflib.get_close_matches(spec, local + names, n=5, cutoff=0.6)
        lines = [f"Unknown task {spec!r}: not a folder, not a local task under data_dir, not an mteb task."]
        if close:
            lines.append(f"Did you mean: {', '.join(close)}?")
        if data_dir is None:
            lines.append("Local tasks are looked up under --data-dir, as <data-dir>/<type>/<name>.")
        elif local:
            lines.append(f"Local tasks in {data_dir}: {', '.join(local)}.")
        else:
            lines.append(f"No local tasks found under {data_dir}.")
        raise UnknownTaskError(" ".join(lines)) from None
    if eval_splits:
        hub_task = hub_task.filter_eval_splits(list(eval_splits))
    return apply_identical_ids(hub_task, identical_ids)


def load_task_data(task: Any, data_dir: str | Path | None) -> None:
    """Load ``task``'s data (once). A hub task that cannot be loaded (e.g. offline) raises :class:`TaskDataError`
    naming a local copy when there is one; a hub retrieval task's judgements are then checked as local folders'
    are (:func:`cde_st.data.check_relevance_judgements`)."""
    if task.data_loaded:
        return
    try:
        task.load_data()
    except Exception as err:
        if getattr(task, "local_source", None) is not None:
            raise
        local = list_local_tasks(data_dir)
        twin = [n for n in local if n.replace("_", "").lower() in task.metadata.name.replace("-", "").lower()]
        hint = f" A local copy may exist: {', '.join(twin)} (with --data-dir {data_dir})." if twin else ""
        raise TaskDataError(
            f"Could not load the data of mteb task {task.metadata.name!r} ({task.metadata.dataset.get('path')}) "
            f"from the Hugging Face hub: {type(err).__name__}: {err}. Without network access, evaluate a local "
            f"folder instead (a path, or a folder name with --data-dir).{hint}"
        ) from err
    if getattr(task, "local_source", None) is None:  # local folders are checked as they are read
        _check_retrieval_judgements(task)


def _check_retrieval_judgements(task: Any) -> None:
    """The relevance-judgement check of local folders, for a retrieval task mteb loaded itself (hub data)."""
    if task.metadata.type not in {"Retrieval", "InstructionRetrieval"} or not isinstance(task.dataset, Mapping):
        return
    for subset, splits in task.dataset.items():
        if not isinstance(splits, Mapping):
            continue
        for split, data in splits.items():
            if not isinstance(data, Mapping) or not {"corpus", "queries", "relevant_docs"} <= set(data):
                continue
            if data["corpus"] is None or data["queries"] is None or not data["relevant_docs"]:
                continue
            data["relevant_docs"] = check_relevance_judgements(
                data["relevant_docs"],
                {str(i) for i in column(data["queries"], "id")},
                {str(i) for i in column(data["corpus"], "id")},
                where=f"mteb task {task.metadata.name} ({task.metadata.dataset.get('path')}), subset {subset}, "
                f"split {split}",
            )


def first_subset_split(task: Any) -> tuple[str, str]:
    """The first (subset, evaluation split) of a task: where a whole-task corpus is read from."""
    return task.hf_subsets[0], task.eval_splits[0]
