"""The data layer: reading evaluation and training files, validated, with errors that name the file and line.

One reader per format, used by the evaluation kit, the in-training evaluators and the trainer alike:

- :func:`read_jsonl`: JSON-lines records (``.jsonl`` or ``.jsonl.gz``) with required and optional fields of known
  types;
- :func:`read_qrels`: a BEIR qrels TSV (``query-id  corpus-id  score``) as ``{query: {document: grade}}``;
- :func:`load_beir`: one split of a BEIR folder (``corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``,
  ``qrels/<split>.tsv``) as a :class:`BeirSplit`, its judgements checked against its corpus and queries;
- :func:`document_text`: the one rule that turns a retrieval document's title and text into the text a model reads;
- :func:`column` / :func:`as_list`: a ``datasets.Dataset`` column as a list, read in one piece.

Every problem with a file raises :class:`DataError` (a ``ValueError``) naming the file, and the line where there is
one; problems that still leave something to score (a few judgements of unknown documents, repeated records) are
logged as warnings.

Example:
    >>> split = load_beir("path/to/data/retrieval/scifact", "test")  # doctest: +SKIP
    >>> doc_id, doc = next(iter(split.corpus.items()))  # doctest: +SKIP
    >>> document_text(doc["title"], doc["text"])  # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The file endings a JSON-lines file may have (gzip by suffix).
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file (and line)."""


def document_text(title: str | None, text: str) -> str:
    """One retrieval document as a model reads it: ``title + " " + text`` (just the text without a title),
    stripped, as mteb's retrieval dataloader forms it. Evaluation, its context pools, the beir search and the
    trainer's BEIR pairs all read documents this way, so a document has one text everywhere.

    Example:
        >>> document_text("Rain", "falls from clouds."), document_text("", " no title ")
        ('Rain falls from clouds.', 'no title')
    """
    return (f"{title} {text}" if title else text).strip()


#: Relevance judgements may point at missing documents / queries up to this share (a warning says how many);
#: beyond it the qrels and the corpus or queries do not belong together and loading fails.
MAX_MISSING_SHARE = 0.5


def column(dataset: Any, name: str) -> list[Any]:
    """The values of column ``name`` of a ``datasets.Dataset`` (or of a dict of lists), as a new list.

    Since datasets 4, ``dataset[name]`` is a lazy ``Column`` that, iterated, reads the table one row at a time (tens
    of microseconds a row: over a minute for the two text columns of 300k pairs); sliced, it reads the column in
    one piece, as a list, honouring a filter's or shuffle's row order.
    """
    return as_list(dataset[name])


def as_list(values: Any) -> list[Any]:
    """``values`` as a new list: a datasets ``Column`` (what ``dataset[name]`` gives) is sliced, read in one piece,
    rather than iterated row by row (see :func:`column`); any other iterable is listed."""
    try:
        from datasets.arrow_dataset import Column  # datasets >= 4
    except ImportError:
        return list(values)
    return values[:] if isinstance(values, Column) else list(values)


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
    judgements (or judged queries) missing: a warning with the count and a few ids; more: :class:`DataError`,
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
            raise DataError(
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
            raise DataError(
                f"{text} and would score 0. The qrels and the corpus do not belong together (another dataset, "
                "split or id format?)."
            )
        logger.warning("%s; missing documents count as not retrieved.", text)
    return qrels


# ----------------------------------------------------------------------------------------------------------------
# File readers


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) for the non-blank lines of a text file (gzip by suffix); an unreadable file (not UTF-8,
    truncated, not gzip) raises :class:`DataError` naming it."""
    try:
        with _open_text(path) as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    yield lineno, line
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err}).") from err
    except (OSError, EOFError) as err:  # truncated / not-gzip files
        raise DataError(f"{path}: cannot be read ({err}).") from err


def _check_unicode(text: str, where: str) -> None:
    """A JSON escape such as ``\\ud800`` without its pair decodes to a lone surrogate, which no tokenizer, hash or
    Arrow table can encode (a bare UnicodeEncodeError far from the file): name ``where`` (file:line: field)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{where} holds a lone surrogate character {text[exc.start]!r} at position {exc.start} (a \\uXXXX escape "
            f"without its pair), which is not valid Unicode text: {text!r:.80}. Fix that text in the file."
        ) from None


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "sentence1": (str,),
    "sentence2": (str,),
    "_id": (str, int),
    "title": (str,),
    "score": (int, float),
    "label": (int, str),
    "query": (str,),
    "document": (str,),
    "domain": (str,),
}


def read_jsonl(path: str | Path, fields: Sequence[str], optional: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Read a JSON-lines file (``.jsonl`` or ``.jsonl.gz``) whose records must have ``fields``.

    Every record is checked: valid JSON object, required fields present, each field of the expected type
    (texts are strings, scores numbers, labels int or str). Errors raise :class:`DataError` naming the file and
    line. Only the listed fields are kept.
    """
    return [row for _, row in read_jsonl_lines(path, fields, optional)]


def read_jsonl_lines(
    path: str | Path, fields: Sequence[str], optional: Sequence[str] = ()
) -> list[tuple[int, dict[str, Any]]]:
    """:func:`read_jsonl` with the line number of each record: ``[(line, record), ...]``."""
    path = Path(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in iter_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: invalid JSON ({err.msg} at column {err.colno}).") from err
        if not isinstance(record, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}.")
        row: dict[str, Any] = {}
        for field in (*fields, *optional):
            if field not in record or record[field] is None:
                if field in optional:
                    continue
                raise DataError(
                    f"{path}:{lineno}: missing field {field!r} (required: {', '.join(fields)}; "
                    f"found: {', '.join(record) or 'none'})."
                )
            value = record[field]
            types = _FIELD_TYPES.get(field, (object,))
            if isinstance(value, bool) or not isinstance(value, types):
                expected = " or ".join(t.__name__ for t in types)
                raise DataError(
                    f"{path}:{lineno}: field {field!r} must be {expected}, got {type(value).__name__} {value!r:.60}."
                )
            if isinstance(value, str) and not value.isascii():
                _check_unicode(value, f"{path}:{lineno}: field {field!r}")
            row[field] = value
        rows.append((lineno, row))
    if not rows:
        raise DataError(f"{path}: no records.")
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
        raise DataError(
            f"{where}: relevance score {score!r} is not a number (expected an integer grade such as 0, 1 or 2; "
            f"a header line must be exactly {' '.join(QRELS_HEADER)!r}, tab-separated)."
        ) from None
    if not math.isfinite(value):
        raise DataError(f"{where}: relevance score {score!r} is not a finite number; use an integer grade.")
    if not value.is_integer():
        raise DataError(
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
    Errors raise :class:`DataError` naming the file and line.
    """
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    repeats = 0
    for lineno, line in iter_lines(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 3:
            parts = line.split()
        if len(parts) != 3:
            raise DataError(
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
                raise DataError(
                    f"{where}: query {qid!r}, document {did!r} is judged {value} here and {qrels[qid][did]} at line "
                    f"{previous}; keep one judgement per pair."
                )
            repeats += 1
            continue
        seen[(qid, did)] = lineno
        qrels.setdefault(qid, {})[did] = value
    if not qrels:
        raise DataError(f"{path}: no relevance judgements.")
    if repeats:
        logger.warning(
            "%s: %d (query, document) judgements are repeated with the same grade; read once.", path, repeats
        )
    unjudged = [q for q, docs in qrels.items() if not any(v > 0 for v in docs.values())]
    if unjudged:
        if len(unjudged) == len(qrels):
            raise DataError(f"{path}: no judgement has a grade above 0; nothing is relevant to any query.")
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
# BEIR folders


def find_jsonl(folder: str | Path, stem: str) -> Path | None:
    """``folder/<stem>.jsonl`` or ``folder/<stem>.jsonl.gz``, whichever exists first; ``None`` when neither does."""
    for suffix in JSONL_SUFFIXES:
        candidate = Path(folder) / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def beir_splits(folder: str | Path) -> list[str]:
    """The splits of a BEIR folder: one per ``qrels/<split>.tsv``."""
    return sorted(p.name[: -len(".tsv")] for p in (Path(folder) / "qrels").glob("*.tsv"))


def unique_records(rows: list[tuple[int, dict[str, Any]]], path: Path) -> list[dict[str, Any]]:
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
                raise DataError(
                    f"{path}:{lineno}: _id {key!r} is also at line {line0} with another text; ids must be unique."
                )
            repeats += 1
            continue
        first[key] = (lineno, row)
        kept.append(row)
    if repeats:
        logger.warning("%s: %d records repeat an earlier _id with the same text; read once.", path, repeats)
    return kept


@dataclass
class BeirSplit:
    """One split of a BEIR folder, ids as strings, in file order.

    Attributes:
        corpus: document id -> ``{"title": str, "text": str}`` (title ``""`` when the record has none).
        queries: query id -> text, only the queries that have relevance judgements (the ones that are scored).
        qrels: query id -> {document id: integer grade}, checked against ``corpus`` and ``queries``.
    """

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    def document_texts(self) -> dict[str, str]:
        """Document id -> the text a model reads (:func:`document_text`)."""
        return {i: document_text(doc["title"], doc["text"]) for i, doc in self.corpus.items()}


def load_beir(folder: str | Path, split: str) -> BeirSplit:
    """Read split ``split`` of a BEIR folder: ``corpus.jsonl[.gz]`` (``_id, text``, optional ``title``),
    ``queries.jsonl[.gz]`` (``_id, text``) and ``qrels/<split>.tsv`` (:func:`read_qrels`).

    Ids must be unique within a file (an exact repeat is read once). Judgements are checked with
    :func:`check_relevance_judgements`: a few pointing at unknown documents or queries warn, too many raise. Only
    judged queries are kept, as beir's own loader does. Errors raise :class:`DataError` naming the file (and line).
    """
    folder = Path(folder)
    corpus_path, queries_path = find_jsonl(folder, "corpus"), find_jsonl(folder, "queries")
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path, what in ((corpus_path, "corpus.jsonl"), (queries_path, "queries.jsonl")):
        if path is None:
            raise DataError(f"{folder}: missing {what} (BEIR layout).")
    if not qrels_path.is_file():
        raise DataError(f"{folder}: missing qrels/{split}.tsv (found: {beir_splits(folder)}).")
    corpus_rows = unique_records(read_jsonl_lines(corpus_path, ["_id", "text"], optional=["title"]), corpus_path)
    query_rows = unique_records(read_jsonl_lines(queries_path, ["_id", "text"]), queries_path)
    qrels = check_relevance_judgements(
        read_qrels(qrels_path),
        {str(r["_id"]) for r in query_rows},
        {str(r["_id"]) for r in corpus_rows},
        where=f"local task {folder.name}, {qrels_path}",
        queries_name=queries_path.name,
        corpus_name=corpus_path.name,
    )
    return BeirSplit(
        corpus={str(r["_id"]): {"title": r.get("title", ""), "text": r["text"]} for r in corpus_rows},
        queries={str(r["_id"]): r["text"] for r in query_rows if str(r["_id"]) in qrels},
        qrels=qrels,
    )
