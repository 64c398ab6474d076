"""Local evaluation folders (the formats of ``../shared/data``) as mteb tasks.

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

Scoring is always mteb's own; this module only reads files, validates them (errors name the file and line) and hands
mteb the dataset layout its task classes expect.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The five local formats, named like the type subfolders of ``../shared/data``.
TASK_KINDS = ("retrieval", "sts", "classification", "clustering", "pair_classification")

#: mteb task type of each local format.
KIND_TO_MTEB_TYPE = {
    "retrieval": "Retrieval",
    "sts": "STS",
    "classification": "Classification",
    "clustering": "Clustering",
    "pair_classification": "PairClassification",
}

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

#: ``identical_ids`` choices: ``auto`` (an mteb twin's own setting; else decided from the texts, see
#: :func:`queries_are_documents`), ``ignore``, ``keep``.
IDENTICAL_IDS_RULES = ("auto", "ignore", "keep")

_SPLIT_PREFERENCE = ("test", "dev", "validation", "val")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


class LocalDataError(ValueError):
    """A local evaluation file is missing or malformed; the message names the file (and line)."""


#: Relevance judgements may point at missing documents / queries up to this share (a warning says how many);
#: beyond it the qrels and the corpus or queries do not belong together and loading fails.
MAX_MISSING_SHARE = 0.5


def _examples(ids: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(repr(i) for i in ids[:n])
    return shown + (f", ... ({len(ids) - n} more)" if len(ids) > n else "")


def check_relevance_judgements(
    qrels: dict[str, dict[str, int]],
    query_ids: set[str],
    corpus_ids: set[str],
    *,
    where: str,
    queries_name: str = "the queries",
    corpus_name: str = "the corpus",
) -> dict[str, dict[str, int]]:
    """Check that judged query ids are queries and judged document ids are documents; return the qrels of the
    known queries.

    A judgement whose document is not in the corpus can never be retrieved: its query scores as if that document
    were missed (NDCG@10 0 when all its documents are missing). Up to :data:`MAX_MISSING_SHARE` of the
    judgements (or judged queries) missing: a warning with the count and a few ids; more: :class:`LocalDataError`,
    naming ``where`` (task and file) and a few missing ids. Unknown query ids are dropped (never scored).
    """
    unknown_queries = [q for q in qrels if q not in query_ids]
    if unknown_queries:
        share = len(unknown_queries) / len(qrels)
        text = (
            f"{where}: {len(unknown_queries)} of {len(qrels)} judged query ids are not in {queries_name} "
            f"(e.g. {_examples(unknown_queries)})"
        )
        if share > MAX_MISSING_SHARE:
            raise LocalDataError(
                f"{text}. The qrels and the queries do not belong together (another dataset, split or id format?)."
            )
        logger.warning("%s; those queries are not scored.", text)
        qrels = {q: docs for q, docs in qrels.items() if q in query_ids}
    judged = [(q, d) for q, docs in qrels.items() for d in docs]
    missing = [d for _, d in judged if d not in corpus_ids]
    if missing:
        lost = sum(1 for docs in qrels.values() if not any(d in corpus_ids for d in docs))
        text = (
            f"{where}: {len(missing)} of {len(judged)} relevance judgements point at documents that are not in "
            f"{corpus_name} (e.g. {_examples(list(dict.fromkeys(missing)))}); {lost} of {len(qrels)} judged queries "
            "have no relevant document left"
        )
        if len(missing) / len(judged) > MAX_MISSING_SHARE:
            raise LocalDataError(
                f"{text} and would score 0. The qrels and the corpus do not belong together (another dataset, "
                "split or id format?)."
            )
        logger.warning("%s; missing documents count as not retrieved.", text)
    return qrels


# ----------------------------------------------------------------------------------------------------------------
# File readers


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) for the non-blank lines of a text file (gzip by suffix), with file-level errors."""
    try:
        with _open_text(path) as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError as err:
        raise LocalDataError(f"{path}: not UTF-8 text ({err}).") from err
    except (OSError, EOFError) as err:  # truncated / not-gzip files
        raise LocalDataError(f"{path}: cannot be read ({err}).") from err


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "sentence1": (str,),
    "sentence2": (str,),
    "_id": (str, int),
    "title": (str,),
    "score": (int, float),
    "label": (int, str),
}


def read_jsonl(path: str | Path, fields: Sequence[str], optional: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Read a JSON-lines file (``.jsonl`` or ``.jsonl.gz``) whose records must have ``fields``.

    Every record is checked: valid JSON object, required fields present, each field of the expected type
    (texts are strings, scores numbers, labels int or str). Errors raise :class:`LocalDataError` naming the file and
    line. Only the listed fields are kept.
    """
    return [row for _, row in read_jsonl_lines(path, fields, optional)]


def read_jsonl_lines(
    path: str | Path, fields: Sequence[str], optional: Sequence[str] = ()
) -> list[tuple[int, dict[str, Any]]]:
    """:func:`read_jsonl` with the line number of each record: ``[(line, record), ...]``."""
    path = Path(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in _iter_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise LocalDataError(f"{path}:{lineno}: invalid JSON ({err.msg} at column {err.colno}).") from err
        if not isinstance(record, dict):
            raise LocalDataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}.")
        row: dict[str, Any] = {}
        for field in (*fields, *optional):
            if field not in record or record[field] is None:
                if field in optional:
                    continue
                raise LocalDataError(
                    f"{path}:{lineno}: missing field {field!r} (required: {', '.join(fields)}; "
                    f"found: {', '.join(record) or 'none'})."
                )
            value = record[field]
            types = _FIELD_TYPES.get(field, (object,))
            if isinstance(value, bool) or not isinstance(value, types):
                expected = " or ".join(t.__name__ for t in types)
                raise LocalDataError(
                    f"{path}:{lineno}: field {field!r} must be {expected}, got {type(value).__name__} {value!r:.60}."
                )
            row[field] = value
        rows.append((lineno, row))
    if not rows:
        raise LocalDataError(f"{path}: no records.")
    return rows


#: The header line of BEIR's qrels files; any other first line is read as a judgement.
QRELS_HEADER = ("query-id", "corpus-id", "score")


def _relevance_grade(score: str, where: str) -> int:
    """An integer relevance grade from a qrels score field; anything else raises naming ``where`` (file:line).

    pytrec_eval, which scores mteb's and BEIR's retrieval, takes integer grades only: a fractional grade cannot be
    scored as given and is an error rather than silently truncated (0.5 would become "not relevant")."""
    try:
        return int(score)
    except ValueError:
        pass
    try:
        value = float(score)
    except ValueError:
        raise LocalDataError(
            f"{where}: relevance score {score!r} is not a number (expected an integer grade such as 0, 1 or 2; "
            f"a header line must be exactly {' '.join(QRELS_HEADER)!r}, tab-separated)."
        ) from None
    if not math.isfinite(value):
        raise LocalDataError(f"{where}: relevance score {score!r} is not a finite number; use an integer grade.")
    if not value.is_integer():
        raise LocalDataError(
            f"{where}: relevance score {score!r} is fractional; retrieval scoring (pytrec_eval) takes integer grades "
            "only. Map the grades to integers in the file (e.g. 0 / 0.5 / 1 -> 0 / 1 / 2)."
        )
    return int(value)


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (``query-id  corpus-id  score``) into mteb's layout ``{query: {doc: grade}}``.

    The first line may be BEIR's header (exactly ``query-id  corpus-id  score``). Grades must be integers (``1.0``
    is read as 1; fractional, non-finite or non-numeric scores raise). A (query, document) pair judged twice with
    different grades raises naming both lines; an exact repeat is read once, with a warning. Queries whose every
    judgement is <= 0 can never score above 0: they are left out of scoring, with a warning naming them.
    Errors raise :class:`LocalDataError` naming the file and line.
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    repeats = 0
    for lineno, line in _iter_lines(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 3:
            parts = line.split()
        if len(parts) != 3:
            raise LocalDataError(
                f"{path}:{lineno}: expected 3 tab-separated columns (query-id, corpus-id, score), got {len(parts)}."
            )
        qid, did, score = (p.strip() for p in parts)
        if not seen and not qrels and (qid, did, score) == QRELS_HEADER:
            continue
        where = f"{path}:{lineno}"
        value = _relevance_grade(score, where)
        previous = seen.get((qid, did))
        if previous is not None:
            if qrels[qid][did] != value:
                raise LocalDataError(
                    f"{where}: query {qid!r}, document {did!r} is judged {value} here and {qrels[qid][did]} at line "
                    f"{previous}; keep one judgement per pair."
                )
            repeats += 1
            continue
        seen[(qid, did)] = lineno
        qrels.setdefault(qid, {})[did] = value
    if not qrels:
        raise LocalDataError(f"{path}: no relevance judgements.")
    if repeats:
        logger.warning("%s: %d (query, document) judgements are repeated with the same grade; read once.", path, repeats)
    unjudged = [q for q, docs in qrels.items() if not any(v > 0 for v in docs.values())]
    if unjudged:
        if len(unjudged) == len(qrels):
            raise LocalDataError(f"{path}: no judgement has a grade above 0; nothing is relevant to any query.")
        logger.warning(
            "%s: %d of %d judged queries have no document graded above 0 (e.g. %s); they could only score 0 and are "
            "left out of scoring.",
            path,
            len(unjudged),
            len(qrels),
            _examples(unjudged),
        )
        dropped = set(unjudged)
        qrels = {q: docs for q, docs in qrels.items() if q not in dropped}
    return qrels


# ----------------------------------------------------------------------------------------------------------------
# Folder inspection


def _find_file(folder: Path, stem: str) -> Path | None:
    for suffix in _JSONL_SUFFIXES:
        candidate = folder / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def available_splits(folder: str | Path, kind: str) -> list[str]:
    """The splits a local folder provides (retrieval: one per ``qrels/<split>.tsv``; others: ``<split>.jsonl``)."""
    folder = Path(folder)
    if kind == "retrieval":
        return sorted(p.name[: -len(".tsv")] for p in (folder / "qrels").glob("*.tsv"))
    names = set()
    for suffix in _JSONL_SUFFIXES:
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
        raise LocalDataError(f"{folder}: not a folder.")
    if folder.parent.name in TASK_KINDS:
        return folder.parent.name
    if _find_file(folder, "corpus") is not None or (folder / "qrels").is_dir():
        return "retrieval"
    splits = available_splits(folder, "sts")
    if not splits:
        raise LocalDataError(
            f"{folder}: no evaluation files found (expected a BEIR folder with corpus.jsonl, queries.jsonl and "
            "qrels/<split>.tsv, or <split>.jsonl files)."
        )
    first = _find_file(folder, splits[0])
    assert first is not None
    _, line = next(_iter_lines(first), (0, "{}"))
    try:
        keys = set(json.loads(line))
    except (json.JSONDecodeError, TypeError) as err:
        raise LocalDataError(f"{first}:1: invalid JSON, cannot tell the task format.") from err
    if {"sentence1", "sentence2", "score"} <= keys:
        return "sts"
    if {"sentence1", "sentence2", "label"} <= keys:
        return "pair_classification"
    if {"text", "label"} <= keys:
        return "classification" if "train" in splits and len(splits) > 1 else "clustering"
    raise LocalDataError(
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


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.lru_cache(maxsize=1)
def _registry_index() -> tuple[tuple[str, str, str, str, bool, tuple[str, ...]], ...]:
    """(name, dataset name, type, superseded_by, multilingual, subsets) of every task in mteb's registry."""
    import mteb

    rows = []
    for task in mteb.get_tasks(exclude_superseded=False):
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


# ----------------------------------------------------------------------------------------------------------------
# Loaders: files -> the dataset layout of the mteb abstract task of each format


def _split_file(folder: Path, split: str) -> Path:
    path = _find_file(folder, split)
    if path is None:
        raise LocalDataError(f"{folder}: missing {split}.jsonl (found splits: {available_splits(folder, 'sts')}).")
    return path


def _check_labels(rows: list[dict[str, Any]], path: Path, one_label: str | None = None) -> None:
    """Labels of one type; with ``one_label`` (why one label cannot be scored), at least two distinct labels."""
    if one_label is not None and len({r["label"] for r in rows}) < 2:
        raise LocalDataError(
            f"{path}: all {len(rows)} records have the label {rows[0]['label']!r}: {one_label}; give at least two labels."
        )
    kinds = {type(r["label"]) for r in rows}
    if len(kinds) > 1:
        first = type(rows[0]["label"])
        for lineno, row in enumerate(rows, start=1):
            if type(row["label"]) is not first:
                raise LocalDataError(
                    f"{path}: labels mix {first.__name__} and {type(row['label']).__name__} "
                    f"(record {lineno}: {row['label']!r}); use one type."
                )


def _unique_ids(rows: list[tuple[int, dict[str, Any]]], path: Path) -> list[dict[str, Any]]:
    """The records of a corpus / queries file, one per ``_id``: an exact repeat (same title and text) is read once
    with a warning; the same id with another text raises naming both lines (file order must not decide what is
    scored)."""
    first: dict[str, tuple[int, dict[str, Any]]] = {}
    kept: list[dict[str, Any]] = []
    repeats = 0
    for lineno, row in rows:
        key = str(row["_id"])
        if key in first:
            line0, row0 = first[key]
            if (row0.get("title", ""), row0["text"]) != (row.get("title", ""), row["text"]):
                raise LocalDataError(
                    f"{path}:{lineno}: _id {key!r} is also at line {line0} with another text; ids must be unique."
                )
            repeats += 1
            continue
        first[key] = (lineno, row)
        kept.append(row)
    if repeats:
        logger.warning("%s: %d records repeat an earlier _id with the same text; read once.", path, repeats)
    return kept


def load_retrieval_split(folder: str | Path, split: str) -> dict[str, Any]:
    """A BEIR folder split as mteb's ``RetrievalSplitData`` (corpus, queries with judgements, qrels)."""
    from datasets import Dataset

    folder = Path(folder)
    corpus_path, queries_path = _find_file(folder, "corpus"), _find_file(folder, "queries")
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path, what in ((corpus_path, "corpus.jsonl"), (queries_path, "queries.jsonl")):
        if path is None:
            raise LocalDataError(f"{folder}: missing {what} (BEIR layout).")
    if not qrels_path.is_file():
        raise LocalDataError(f"{folder}: missing qrels/{split}.tsv (found: {available_splits(folder, 'retrieval')}).")
    corpus_rows = _unique_ids(read_jsonl_lines(corpus_path, ["_id", "text"], optional=["title"]), corpus_path)
    query_rows = _unique_ids(read_jsonl_lines(queries_path, ["_id", "text"]), queries_path)
    qrels = read_qrels(qrels_path)

    qrels = check_relevance_judgements(
        qrels,
        {str(r["_id"]) for r in query_rows},
        {str(r["_id"]) for r in corpus_rows},
        where=f"local task {folder.name}, {qrels_path}",
        queries_name=queries_path.name,
        corpus_name=corpus_path.name,
    )
    corpus = Dataset.from_dict(
        {
            "id": [str(r["_id"]) for r in corpus_rows],
            "title": [r.get("title", "") for r in corpus_rows],
            "text": [r["text"] for r in corpus_rows],
        }
    )
    judged = [r for r in query_rows if str(r["_id"]) in qrels]
    queries = Dataset.from_dict({"id": [str(r["_id"]) for r in judged], "text": [r["text"] for r in judged]})
    return {"corpus": corpus, "queries": queries, "relevant_docs": qrels, "top_ranked": None}


def load_sts_split(folder: str | Path, split: str):
    """``sentence1, sentence2, score`` records as a ``datasets.Dataset``."""
    from datasets import Dataset

    path = _split_file(Path(folder), split)
    rows = read_jsonl(path, ["sentence1", "sentence2", "score"])
    if len(rows) < 2:
        raise LocalDataError(f"{path}: STS needs at least two pairs (a Spearman correlation of one pair is undefined).")
    if len({r["score"] for r in rows}) < 2:
        raise LocalDataError(
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
            raise LocalDataError(f"{path}: record {lineno}: label must be 0 or 1, got {row['label']!r}.")
    if len(rows) < 2:
        raise LocalDataError(f"{path}: pair classification needs at least two pairs.")
    if len({r["label"] for r in rows}) < 2:
        raise LocalDataError(
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
# Identical query / document ids

#: ``identical_ids="auto"`` ignores a query's own id when more than this share of the shared ids are queries that
#: are the document itself (the query text equals or is contained in the document's text).
SAME_TEXT_SHARE = 0.5


def _normal_text(text: str) -> str:
    return " ".join(text.lower().split())


def queries_are_documents(queries: Mapping[str, str], documents: Mapping[str, str]) -> tuple[bool, str]:
    """Whether a query's own id should be left out of its results, decided from the texts: ``(ignore, why)``.

    BEIR's "ignore identical ids" rule exists for datasets whose queries *are* corpus documents (ArguAna, Quora):
    there a query would retrieve itself. Classic test collections (MED, CACM, LISA) number queries and documents
    1..N independently, so ids coincide by accident and query 7 may well be judged relevant to document 7: the rule
    would remove a relevant document. So: ignore only when, for more than :data:`SAME_TEXT_SHARE` of the ids that
    are both a query and a document, the query's text (case and spacing aside) equals or is contained in the
    document's text (``title text``).

    Example:
        >>> queries_are_documents({"1": "a cat"}, {"1": "Title a cat sat", "2": "x"})[0]
        True
    """
    shared = [q for q in queries if q in documents]
    if not shared:
        return False, "auto: no query id is also a corpus id"
    same = sum(1 for q in shared if _normal_text(queries[q]) in _normal_text(documents[q]))
    detail = f"auto, from the texts: {same} of {len(shared)} query ids that are also corpus ids have the query text in"
    if same > SAME_TEXT_SHARE * len(shared):
        return True, f"{detail} that document: the queries are corpus documents"
    return False, f"{detail} that document: the ids coincide, the texts differ"


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
            self._describe_identical_ids()

    def _describe_identical_ids(self) -> None:
        """Count the query ids that are also corpus ids and say which rule scores them (log + ``identical_ids_rule``);
        with ``identical_ids="auto"`` on a folder that is no mteb task, decide the rule from the texts first
        (:func:`queries_are_documents`)."""
        from cde_st.evaluation.pools import corpus_texts

        shared = total = 0
        queries: dict[str, str] = {}
        documents: dict[str, str] = {}
        for splits in self.dataset.values():
            for data in splits.values():
                query_ids = set(data["queries"]["id"])
                shared += len(query_ids & set(data["corpus"]["id"]))
                total += len(query_ids)
                if getattr(self, "identical_ids_from_texts", False):
                    queries.update(zip(data["queries"]["id"], data["queries"]["text"]))
                    documents.update(zip(data["corpus"]["id"], corpus_texts(data["corpus"])))
        if getattr(self, "identical_ids_from_texts", False):
            self.ignore_identical_ids, self.identical_ids_why = queries_are_documents(queries, documents)
        verb = "ignore" if self.ignore_identical_ids else "keep"
        why = self.identical_ids_why
        overlap = f"{shared} of {total} query ids are also corpus ids"
        self.identical_ids_rule = f"{verb} identical query/document ids ({why}; {overlap})"
        if shared:
            effect = (
                "a query's own document is left out of its results"
                if self.ignore_identical_ids
                else "a query may retrieve its own document"
            )
            logger.warning("%s: %s: %s.", self.metadata.name, self.identical_ids_rule, effect)
        else:
            logger.info("%s: %s.", self.metadata.name, self.identical_ids_rule)


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
        >>> task = load_local_task("../shared/data/retrieval/scifact")  # doctest: +SKIP
        >>> task.metadata.name, task.metadata.main_score  # doctest: +SKIP
        ('scifact', 'ndcg_at_10')
    """
    import mteb
    from mteb.abstasks.task_metadata import TaskMetadata

    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise LocalDataError(f"{folder}: task folder does not exist.")
    name = name or folder.name
    kind = kind or detect_kind(folder)
    if kind not in TASK_KINDS:
        raise ValueError(f"Unknown local task format {kind!r}; expected one of {TASK_KINDS}.")
    if identical_ids not in IDENTICAL_IDS_RULES:
        raise ValueError(f"identical_ids must be one of {IDENTICAL_IDS_RULES}, got {identical_ids!r}.")
    if twin is None:
        twin_name, hf_subset = MTEB_TWINS.get(folder.name) or registry_twin(folder.name, kind) or ("", "default")
    else:
        twin_name, _, hf_subset = twin.partition(":")
        hf_subset = hf_subset or "default"

    split_files = TWIN_SPLIT_FILES.get(folder.name) if twin is None and twin_name else None
    present = available_splits(folder, kind)
    if split_files:  # an mteb split counts as present when one of its files is
        present = sorted(set(present) | {s for s, files in split_files.items() if set(files) & set(present)})
    dataset = {"path": str(folder), "revision": f"local-{folder_fingerprint(folder)}"}
    if twin_name:
        twin_task = mteb.get_task(twin_name)
        base = type(twin_task)
        if KIND_TO_MTEB_TYPE[kind] != twin_task.metadata.type:
            raise ValueError(f"{folder}: a {kind} folder cannot reuse the {twin_task.metadata.type} task {twin_name}.")
        wanted = list(eval_splits or [s for s in twin_task.metadata.eval_splits if s in present])
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
        metadata = twin_task.metadata.model_copy(update=update)
    else:
        base = _generic_base(kind)
        wanted = list(eval_splits or [s for s in _SPLIT_PREFERENCE if s in present][:1])
        metadata = TaskMetadata(
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
    if not wanted:
        raise LocalDataError(
            f"{folder}: no evaluation split found (available: {present or 'none'}; expected "
            f"{', '.join(twin_task.metadata.eval_splits) if twin_name else 'test, dev or validation'})."
        )
    missing = [s for s in wanted if s not in present]
    if missing:
        raise LocalDataError(f"{folder}: requested split(s) {missing} not found (available: {present}).")
    metadata = metadata.model_copy(update={"eval_splits": wanted})

    train_split = None
    if kind == "classification":
        train_split = getattr(base, "train_split", "train")
        if train_split not in present:
            raise LocalDataError(f"{folder}: classification needs {train_split}.jsonl to fit the classifier.")
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
        if identical_ids != "auto":
            task.ignore_identical_ids = identical_ids == "ignore"
            task.identical_ids_why = f"identical_ids={identical_ids!r} was asked for"
        elif twin_name:
            task.identical_ids_why = f"the setting of mteb task {twin_name}"
        else:  # decided from the texts when the data is read (_describe_identical_ids)
            task.ignore_identical_ids = False
            task.identical_ids_from_texts = True
            task.identical_ids_why = "decided from the texts when the data is loaded"
        verb = "ignore" if task.ignore_identical_ids else "keep"
        task.identical_ids_rule = f"{verb} identical query/document ids ({task.identical_ids_why})"
    return task


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
