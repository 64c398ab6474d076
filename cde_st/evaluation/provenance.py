"""Provenance of cached results: what a stored score was computed from, so that a cached result is reused only
for the same data, context documents and scoring settings.

mteb's result cache keys a result by model name, revision and run settings (``experiment_kwargs``); its
``only-missing`` strategy then returns any complete cached result, whatever data or context produced it. Beside
mteb's ``<task>.json`` files a run records, per task, the dataset revision (a content hash for local folders), the
context fingerprint of each subset/split, the identical-ids rule and the token limit (:data:`PROVENANCE_FILE`);
:func:`check_cached` compares them before a result is reused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Beside mteb's ``<task>.json`` files (not ``.json``: mteb would read it as a task result).
PROVENANCE_FILE = "cde_st_provenance.jsonl"


def task_provenance(task: Any, wrapper: Any) -> dict[str, Any]:
    """What a task's score depends on beyond the model name/revision and the run settings in the result path: the
    data (dataset revision: a content hash for local folders), the context documents of each subset/split, the
    scoring rule for identical query/document ids and the token limit."""
    plan = wrapper.plan
    contexts: dict[str, str | None] = {}
    for subset in task.hf_subsets:
        for split in task.eval_splits:
            choice = plan.choose(task.metadata.name, subset, split) if plan is not None else None
            contexts[f"{subset}/{split}"] = choice.fingerprint if choice is not None else None
    return {
        "task": task.metadata.name,
        "dataset_revision": task.metadata.revision,
        "contexts": contexts,
        "ignore_identical_ids": getattr(task, "ignore_identical_ids", None),
        "max_seq_length": getattr(wrapper.model, "max_seq_length", None),
    }


def _provenance_path(cache: Any, meta: Any, task_name: str) -> tuple[Path, Path]:
    result_path = Path(cache.get_task_result_path(task_name, meta))
    return result_path, result_path.parent / PROVENANCE_FILE


def read_provenance(path: Path) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a damaged line only costs a re-run of its task
            if isinstance(record, dict) and "task" in record:
                records[record["task"]] = record
    return records


def check_cached(cache: Any, meta: Any, task_name: str, expected: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the cached result of ``task_name`` may be reused, and a note saying what was done and why.

    mteb's own ``only-missing`` returns any cached result whose splits are complete, whatever data it came from;
    a cached result is reused here only when its recorded provenance matches ``expected``."""
    result_path, record_path = _provenance_path(cache, meta, task_name)
    if not result_path.is_file():
        return False, ""
    recorded = read_provenance(record_path).get(task_name)
    if recorded is None:
        reason = (
            f"{record_path.name} has no record of the data and context it was computed with "
            "(written by mteb directly or an older cde_st)"
        )
    else:
        changes = []
        if recorded.get("dataset_revision") != expected["dataset_revision"]:
            changes.append(
                f"the data changed (dataset revision {recorded.get('dataset_revision')} -> "
                f"{expected['dataset_revision']})"
            )
        old_contexts = recorded.get("contexts") or {}
        changed = [
            f"{key}: {old_contexts[key]} -> {value}"
            for key, value in expected["contexts"].items()
            if key in old_contexts and old_contexts[key] != value
        ]
        if changed:
            changes.append(f"the context documents changed ({'; '.join(changed)})")
        for key, what in (("ignore_identical_ids", "ignore_identical_ids"), ("max_seq_length", "max_seq_length")):
            if recorded.get(key) != expected[key]:
                changes.append(f"{what} changed ({recorded.get(key)} -> {expected[key]})")
        reason = "; ".join(changes)
    if reason:
        logger.warning("%s: re-running instead of reusing %s: %s.", task_name, result_path, reason)
        return False, f"re-ran: {reason}"
    logger.info("%s: reusing %s (same data, context and settings).", task_name, result_path)
    return True, f"reused {result_path} (same data, context and settings)"


def record_provenance(cache: Any, meta: Any, record: dict[str, Any] | None, merge: bool) -> None:
    if record is None:
        return
    _, path = _provenance_path(cache, meta, record["task"])
    records = read_provenance(path)
    previous = records.get(record["task"])
    if merge and previous is not None:  # splits run earlier keep their contexts
        record = {**record, "contexts": {**(previous.get("contexts") or {}), **record["contexts"]}}
    records[record["task"]] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records.values()), encoding="utf-8")
