"""Local evaluation folders (five formats, the layout ``<data_dir>/<type>/<name>``) as mteb tasks.

Five formats, one folder per task:

================== =====================================================================================
retrieval (BEIR)   ``corpus.jsonl[.gz]`` (``_id, title, text``), ``queries.jsonl[.gz]`` (``_id, text``),
                   ``qrels/<split>.tsv`` (``query-id  corpus-id  score``, optional header line)
sts                ``<split>.jsonl[.gz]`` with ``sentence1, sentence2, score``
classification     ``train.jsonl`` + ``<split>.jsonl`` with ``text, label``
clustering         ``<split>.jsonl`` with ``text, label``
pair_classification ``<split>.jsonl`` with ``sentence1, sentence2, label`` (label 0/1)
================== =====================================================================================

A local folder becomes an mteb task named after the folder. When the folder is a local copy of a published mteb task
(``scifact`` -> ``SciFact``, ``banking77`` -> ``Banking77Classification``, ...; see :data:`MTEB_TWINS`), the task
*is* that mteb task class with only the data source replaced: same evaluator, main score, splits, subset, score
normalisation and classifier setup (``n_experiments``, ``samples_per_label``, ``ignore_identical_ids``), so its scores
are comparable to the published ones. Besides the shared folder names, a folder named after any task in mteb's own
registry (its task name or its dataset's name, any case: ``arguana``, ``QUORA``, ``scidocs``; see
:func:`registry_twin`) is that task's copy. Any other folder gets the plain mteb abstract task of its format with
mteb's defaults, except that retrieval decides from the texts whether a query's own id counts among its results:
BEIR's "ignore identical ids" rule applies only when the queries are corpus documents (same id, the query's text in
the document), not when ids merely coincide as in classic collections numbered 1..N (``identical_ids``).

Scoring is always mteb's own; this module hands mteb the dataset layout its task classes expect. The files are read
and validated by :mod:`cde_st.data` (errors name the file and line), the formats are told apart by
:mod:`~cde_st.evaluation.local_folders`, twins are found by :mod:`~cde_st.evaluation.task_registry` and the
identical-ids rule is :mod:`~cde_st.evaluation.identical_ids`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cde_st.data import DataError, find_jsonl, load_beir, read_jsonl, read_jsonl_lines
from cde_st.evaluation.identical_ids import IDENTICAL_IDS_RULES, describe_identical_ids, set_local_rule
from cde_st.evaluation.local_folders import (
    KIND_TO_MTEB_TYPE,
    TASK_KINDS,
    available_splits,
    detect_kind,
    folder_fingerprint,
)
from cde_st.evaluation.task_registry import MTEB_TWINS, TWIN_SPLIT_FILES, registry_twin

# mteb (and datasets) are imported inside the functions that use them: importing mteb takes seconds, and
# ``import cde_st.evaluation`` (and the in-training evaluators) must not pay for it.
#: The package's one data error (cde_st.data.DataError), under the name callers of the evaluation kit know it by.
LocalDataError = DataError

_SPLIT_PREFERENCE = ("test", "dev", "validation", "val")


# ----------------------------------------------------------------------------------------------------------------
# Loaders: files -> the dataset layout of the mteb abstract task of each format


def _split_file(folder: Path, split: str) -> Path:
    path = find_jsonl(folder, split)
    if path is None:
        raise DataError(f"{folder}: missing {split}.jsonl (found splits: {available_splits(folder, 'sts')}).")
    return path


def _check_labels(rows: list[dict[str, Any]], path: Path, one_label: str | None = None) -> None:
    """Labels of one type; with ``one_label`` (why one label cannot be scored), at least two distinct labels."""
    if one_label is not None and len({r["label"] for r in rows}) < 2:
        raise DataError(
            f"{path}: all {len(rows)} records have the label {rows[0]['label']!r}: {one_label}; give at least two labels."
        )
    kinds = {type(r["label"]) for r in rows}
    if len(kinds) > 1:
        first = type(rows[0]["label"])
        for lineno, row in enumerate(rows, start=1):
            if type(row["label"]) is not first:
                raise DataError(
                    f"{path}: labels mix {first.__name__} and {type(row['label']).__name__} "
                    f"(record {lineno}: {row['label']!r}); use one type."
                )


def load_retrieval_split(folder: str | Path, split: str) -> dict[str, Any]:
    """A BEIR folder split (:func:`cde_st.data.load_beir`) as mteb's ``RetrievalSplitData`` (corpus, queries with
    judgements, qrels)."""
    from datasets import Dataset

    data = load_beir(folder, split)
    corpus = Dataset.from_dict(
        {
            "id": list(data.corpus),
            "title": [doc["title"] for doc in data.corpus.values()],
            "text": [doc["text"] for doc in data.corpus.values()],
        }
    )
    queries = Dataset.from_dict({"id": list(data.queries), "text": list(data.queries.values())})
    return {"corpus": corpus, "queries": queries, "relevant_docs": data.qrels, "top_ranked": None}


def load_sts_split(folder: str | Path, split: str):
    """``sentence1, sentence2, score`` records as a ``datasets.Dataset``."""
    from datasets import Dataset

    path = _split_file(Path(folder), split)
    lines = read_jsonl_lines(path, ["sentence1", "sentence2", "score"])
    for lineno, row in lines:
        if not math.isfinite(row["score"]):
            # one NaN gold score makes the Spearman correlation of the whole set NaN
            raise DataError(
                f"{path}:{lineno}: score must be a finite number, got {row['score']!r}; fix or remove that pair."
            )
    rows = [row for _, row in lines]
    if len(rows) < 2:
        raise DataError(f"{path}: STS needs at least two pairs (a Spearman correlation of one pair is undefined).")
    if len({r["score"] for r in rows}) < 2:
        raise DataError(
            f"{path}: every pair has the score {rows[0]['score']!r}; a Spearman correlation needs differing scores."
        )
    return Dataset.from_dict({k: [r[k] for r in rows] for k in ("sentence1", "sentence2", "score")})


def load_classification_split(folder: str | Path, split: str):
    """``text, label`` records as a ``datasets.Dataset`` (columns ``text``, ``label``)."""
    from datasets import Dataset

    path = _split_file(Path(folder), split)
    rows = read_jsonl(path, ["text", "label"])
    _check_labels(rows, path, "a classifier fitted on them has nothing to tell apart" if split == "train" else None)
    return Dataset.from_dict({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]})


def load_clustering_split(folder: str | Path, split: str):
    """``text, label`` records as one cluster set in mteb's clustering layout (``sentences``, ``labels`` lists)."""
    from datasets import Dataset

    path = _split_file(Path(folder), split)
    rows = read_jsonl(path, ["text", "label"])
    _check_labels(rows, path, "a clustering of them into one cluster scores perfectly whatever the model")
    return Dataset.from_dict({"sentences": [[r["text"] for r in rows]], "labels": [[r["label"] for r in rows]]})


def load_pair_classification_split(folder: str | Path, split: str):
    """``sentence1, sentence2, label`` records (label 0/1) as mteb's pair layout (``labels`` column)."""
    from datasets import Dataset

    path = _split_file(Path(folder), split)
    rows = read_jsonl(path, ["sentence1", "sentence2", "label"])
    for lineno, row in enumerate(rows, start=1):
        if row["label"] not in (0, 1):
            raise DataError(f"{path}: record {lineno}: label must be 0 or 1, got {row['label']!r}.")
    if len(rows) < 2:
        raise DataError(f"{path}: pair classification needs at least two pairs.")
    if len({r["label"] for r in rows}) < 2:
        raise DataError(
            f"{path}: every pair has label {rows[0]['label']!r}; average precision needs pairs of both labels (0 and 1)."
        )
    return Dataset.from_dict(
        {
            "sentence1": [r["sentence1"] for r in rows],
            "sentence2": [r["sentence2"] for r in rows],
            "labels": [int(r["label"]) for r in rows],
        }
    )


_SPLIT_LOADERS = {
    "retrieval": load_retrieval_split,
    "sts": load_sts_split,
    "classification": load_classification_split,
    "clustering": load_clustering_split,
    "pair_classification": load_pair_classification_split,
}


# ----------------------------------------------------------------------------------------------------------------
# Local folders as mteb tasks


@dataclass(frozen=True)
class LocalTaskSource:
    """Where a local task's data lives and how to read it (``split_files``: mteb split -> local files to join)."""

    folder: Path
    kind: str
    hf_subset: str = "default"
    train_split: str | None = None
    split_files: dict[str, tuple[str, ...]] | None = None

    def files_of(self, split: str) -> list[str]:
        """The local splits (files) making up mteb split ``split``, those that exist."""
        wanted = (self.split_files or {}).get(split, (split,))
        present = available_splits(self.folder, self.kind)
        return [name for name in wanted if name in present] or [split]


class _LocalDataMixin:
    """Replaces an mteb task's hub loading by reading a local folder; everything else stays the task's own."""

    local_source: LocalTaskSource

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:  # noqa: ARG002 - mteb signature
        if self.data_loaded:
            return
        source = self.local_source
        load = _SPLIT_LOADERS[source.kind]
        splits = list(self.eval_splits)
        if source.train_split and source.train_split not in splits:
            splits.append(source.train_split)
        if source.kind == "retrieval":
            data: Any = {source.hf_subset: {split: load(source.folder, split) for split in splits}}
        else:
            from datasets import DatasetDict, concatenate_datasets

            data = DatasetDict(
                {
                    split: concatenate_datasets([load(source.folder, name) for name in source.files_of(split)])
                    for split in splits
                }
            )
            if self.metadata.is_multilingual:
                data = {source.hf_subset: data}
        self.dataset = data
        self.data_loaded = True
        if source.kind == "retrieval":
            describe_identical_ids(self)


def _generic_base(kind: str) -> type:
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy
    from mteb.abstasks.pair_classification import AbsTaskPairClassification
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS

    return {
        "retrieval": AbsTaskRetrieval,
        "sts": AbsTaskSTS,
        "classification": AbsTaskClassification,
        "clustering": AbsTaskClusteringLegacy,
        "pair_classification": AbsTaskPairClassification,
    }[kind]


_MAIN_SCORES = {
    "retrieval": "ndcg_at_10",
    "sts": "cosine_spearman",
    "classification": "accuracy",
    "clustering": "v_measure",
    "pair_classification": "max_ap",
}


def load_local_task(
    folder: str | Path,
    *,
    name: str | None = None,
    kind: str | None = None,
    twin: str | None = None,
    eval_splits: Sequence[str] | None = None,
    identical_ids: str = "auto",
):
    """Build the mteb task for a local folder (see the module docstring for the formats).

    Args:
        folder: the task folder.
        name: task name in results (default: the folder name).
        kind: one of :data:`TASK_KINDS` (default: :func:`detect_kind`).
        twin: mteb task whose definition to reuse, ``"Name"`` or ``"Name:subset"`` for a multilingual task
            (default: :data:`MTEB_TWINS` by folder name, else :func:`registry_twin`; ``""`` for none).
        eval_splits: splits to evaluate (default: the twin's that exist locally; else the first of
            test/dev/validation found).
        identical_ids: retrieval only: whether a corpus document with the query's own id counts among the query's
            results. ``"auto"``: an mteb twin's own ``ignore_identical_ids``; for other folders decided from the
            texts at load (:func:`queries_are_documents`: ignore only when the queries are corpus documents).
            ``"ignore"`` / ``"keep"`` force it. The rule used, why, and the number of query ids that are also corpus
            ids are logged at load and kept in ``task.identical_ids_rule``.

    Returns:
        An ``mteb`` ``AbsTask`` instance whose ``load_data`` reads the folder.

    Example:
        >>> task = load_local_task("path/to/data/retrieval/scifact")  # doctest: +SKIP
        >>> task.metadata.name, task.metadata.main_score  # doctest: +SKIP
        ('scifact', 'ndcg_at_10')
    """
    folder, kind = _checked_folder(folder, kind, identical_ids)
    name = name or folder.name
    twin_name, hf_subset = _twin(folder.name, kind, twin)
    split_files = TWIN_SPLIT_FILES.get(folder.name) if twin is None and twin_name else None
    present = _present_splits(folder, kind, split_files)
    dataset = {"path": str(folder), "revision": f"local-{folder_fingerprint(folder)}"}
    if twin_name:
        base, metadata = _twin_metadata(twin_name, hf_subset, kind, name, folder, dataset)
        expected = ", ".join(metadata.eval_splits)
        wanted = list(eval_splits or [s for s in metadata.eval_splits if s in present])
    else:
        base, metadata = _generic_base(kind), _generic_metadata(kind, name, folder, dataset)
        expected = "test, dev or validation"
        wanted = list(eval_splits or [s for s in _SPLIT_PREFERENCE if s in present][:1])
    metadata = metadata.model_copy(update={"eval_splits": _checked_splits(folder, wanted, present, expected)})

    train_split = None
    if kind == "classification":
        train_split = getattr(base, "train_split", "train")
        if train_split not in present:
            raise DataError(f"{folder}: classification needs {train_split}.jsonl to fit the classifier.")
    source = LocalTaskSource(
        folder=folder, kind=kind, hf_subset=hf_subset, train_split=train_split, split_files=split_files
    )
    cls = type(
        f"Local{base.__name__}",
        (_LocalDataMixin, base),
        {"metadata": metadata, "local_source": source, "__module__": __name__},
    )
    task = cls()
    if kind == "retrieval":
        set_local_rule(task, identical_ids, twin_name)
    return task


def _twin(folder_name: str, kind: str, twin: str | None) -> tuple[str, str]:
    """The mteb task whose definition a folder reuses and its subset: ``twin`` (``"Name"`` or ``"Name:subset"``)
    when given, else :data:`MTEB_TWINS` by folder name, else :func:`registry_twin`; ``("", "default")``: none."""
    if twin is None:
        return MTEB_TWINS.get(folder_name) or registry_twin(folder_name, kind) or ("", "default")
    twin_name, _, hf_subset = twin.partition(":")
    return twin_name, hf_subset or "default"


def _present_splits(folder: Path, kind: str, split_files: dict[str, tuple[str, ...]] | None) -> list[str]:
    """The splits ``folder`` holds; with a twin's ``split_files``, an mteb split counts as present when one of its
    files is."""
    present = available_splits(folder, kind)
    if split_files:
        present = sorted(set(present) | {s for s, files in split_files.items() if set(files) & set(present)})
    return present


def _checked_folder(folder: str | Path, kind: str | None, identical_ids: str) -> tuple[Path, str]:
    """The task folder, resolved, and its format, once it exists and the format and identical-ids rule are known."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise DataError(f"{folder}: task folder does not exist.")
    kind = kind or detect_kind(folder)
    if kind not in TASK_KINDS:
        raise ValueError(f"Unknown local task format {kind!r}; expected one of {TASK_KINDS}.")
    if identical_ids not in IDENTICAL_IDS_RULES:
        raise ValueError(f"identical_ids must be one of {IDENTICAL_IDS_RULES}, got {identical_ids!r}.")
    return folder, kind


def _twin_metadata(
    twin_name: str, hf_subset: str, kind: str, name: str, folder: Path, dataset: dict[str, str]
) -> tuple[type, Any]:
    """The mteb twin's task class and its metadata, renamed and pointed at the local folder."""
    import mteb

    twin_task = mteb.get_task(twin_name)
    if KIND_TO_MTEB_TYPE[kind] != twin_task.metadata.type:
        raise ValueError(f"{folder}: a {kind} folder cannot reuse the {twin_task.metadata.type} task {twin_name}.")
    update: dict[str, Any] = {
        "name": name,
        "dataset": dataset,
        "description": f"Local copy of the mteb task {twin_name} read from {folder}.",
        "superseded_by": None,
        "adapted_from": [twin_name],
    }
    if twin_task.metadata.is_multilingual:
        if hf_subset not in twin_task.metadata.eval_langs:
            raise ValueError(
                f"{twin_name} has subsets {twin_task.metadata.hf_subsets}: name one as twin='{twin_name}:<subset>'."
            )
        update["eval_langs"] = {hf_subset: twin_task.metadata.eval_langs[hf_subset]}
    return type(twin_task), twin_task.metadata.model_copy(update=update)


def _generic_metadata(kind: str, name: str, folder: Path, dataset: dict[str, str]) -> Any:
    """The metadata of a local task with no mteb twin."""
    from mteb.abstasks.task_metadata import TaskMetadata

    return TaskMetadata(
        name=name,
        description=f"Local {kind} task read from {folder}.",
        dataset=dataset,
        type=KIND_TO_MTEB_TYPE[kind],
        category="t2t" if kind in ("retrieval", "sts", "pair_classification") else "t2c",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score=_MAIN_SCORES[kind],
    )


def _checked_splits(folder: Path, wanted: list[str], present: list[str], expected: str) -> list[str]:
    """``wanted``, once there is at least one and each exists in the folder."""
    if not wanted:
        raise DataError(f"{folder}: no evaluation split found (available: {present or 'none'}; expected {expected}).")
    missing = [s for s in wanted if s not in present]
    if missing:
        raise DataError(f"{folder}: requested split(s) {missing} not found (available: {present}).")
    return wanted
