"""Local evaluation folders: the five local formats, which one a folder holds, its splits, and
finding a task folder by name under a data directory.

How each format's files read as an mteb task is :mod:`cde_st.evaluation.local_tasks`; the file readers are
:mod:`cde_st.data`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cde_st.data import JSONL_SUFFIXES, DataError, beir_splits, find_jsonl, iter_lines

#: The five local formats, each the name of a type subfolder of a data directory (``<data_dir>/<type>/<name>``).
TASK_KINDS = ("retrieval", "sts", "classification", "clustering", "pair_classification")

#: mteb task type of each local format.
KIND_TO_MTEB_TYPE = {
    "retrieval": "Retrieval",
    "sts": "STS",
    "classification": "Classification",
    "clustering": "Clustering",
    "pair_classification": "PairClassification",
}


def available_splits(folder: str | Path, kind: str) -> list[str]:
    """The splits a local folder provides (retrieval: one per ``qrels/<split>.tsv``; others: ``<split>.jsonl``)."""
    folder = Path(folder)
    if kind == "retrieval":
        return beir_splits(folder)
    names = set()
    for suffix in JSONL_SUFFIXES:
        names.update(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}"))
    return sorted(names)


def detect_kind(folder: str | Path) -> str:
    """Which of the five local formats a folder holds.

    The type subfolder it sits in (``retrieval/``, ``sts/``, ...) decides when it is one of :data:`TASK_KINDS`;
    otherwise the files do: a BEIR layout is retrieval; records with ``score`` are STS, with ``sentence1`` and
    ``label`` pair classification; ``text, label`` records are classification when a train split exists beside
    another split, else clustering.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder.")
    if folder.parent.name in TASK_KINDS:
        return folder.parent.name
    if find_jsonl(folder, "corpus") is not None or (folder / "qrels").is_dir():
        return "retrieval"
    splits = available_splits(folder, "sts")
    if not splits:
        raise DataError(
            f"{folder}: no evaluation files found (expected a BEIR folder with corpus.jsonl, queries.jsonl and "
            "qrels/<split>.tsv, or <split>.jsonl files)."
        )
    first = find_jsonl(folder, splits[0])
    assert first is not None
    _, line = next(iter_lines(first), (0, "{}"))
    try:
        keys = set(json.loads(line))
    except (json.JSONDecodeError, TypeError) as err:
        raise DataError(f"{first}:1: invalid JSON, cannot tell the task format.") from err
    if {"sentence1", "sentence2", "score"} <= keys:
        return "sts"
    if {"sentence1", "sentence2", "label"} <= keys:
        return "pair_classification"
    if {"text", "label"} <= keys:
        return "classification" if "train" in splits and len(splits) > 1 else "clustering"
    raise DataError(
        f"{first}:1: cannot tell the task format from fields {sorted(keys)} (expected sentence1/sentence2/score, "
        "sentence1/sentence2/label or text/label)."
    )


def folder_fingerprint(folder: str | Path) -> str:
    """Short content hash of a local task folder: recorded as the dataset revision of its results."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def find_local_task(name: str, data_dir: str | Path | None) -> Path | None:
    """The folder of local task ``name``: ``name`` itself if it is a folder, else ``data_dir/<type>/<name>`` or
    ``data_dir/<name>``; ``None`` when there is none."""
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        return candidate
    if data_dir is None:
        return None
    root = Path(data_dir).expanduser()
    for sub in (*TASK_KINDS, ""):
        folder = root / sub / name if sub else root / name
        if folder.is_dir() and (sub or folder.name not in TASK_KINDS):
            return folder
    return None


def list_local_tasks(data_dir: str | Path | None) -> list[str]:
    """Names of the task folders under ``data_dir`` (in its type subfolders)."""
    if data_dir is None or not Path(data_dir).is_dir():
        return []
    root = Path(data_dir)
    return sorted(
        p.name for kind in TASK_KINDS if (root / kind).is_dir() for p in (root / kind).iterdir() if p.is_dir()
    )
