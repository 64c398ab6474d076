"""Reading a corpus to embed as a stream of batches: JSON lines (``.jsonl`` / ``.jsonl.gz``), a parquet file, a BEIR
folder (its ``corpus.jsonl[.gz]``) or a folder written by ``datasets``' ``save_to_disk``.

Nothing is read whole: JSON lines are read line by line, parquet and Arrow files a record batch at a time (pyarrow's
batch readers), so memory is bounded by the batch size whatever the corpus size.

Every record has a *position*: its index in the stream (non-blank lines of a JSON-lines file, rows of a table),
counted whether the record is valid or not. The embedding job cuts its shards by position, so a rerun cuts them
where the first run did. A record's id and text are checked here (present, of the right type, text not blank, valid
Unicode); a bad one raises :class:`~cde_st.data.DataError` naming the file and the line (or row), or, with
``skip_invalid=True``, is left out and counted by reason in :attr:`CorpusReader.skipped`.

Example:
    >>> reader = CorpusReader("corpus.jsonl")  # doctest: +SKIP
    >>> for batch in reader.batches(1024):  # doctest: +SKIP
    ...     print(batch.positions[0], batch.ids[0], batch.texts[0][:40])
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cde_st.data import DataError, document_text, find_jsonl

__all__ = ["TABLE_BATCH_ROWS", "CorpusBatch", "CorpusReader", "ID_FIELDS", "corpus_kind"]

#: The id fields looked for, in this order, when none is named: BEIR's ``_id``, then ``id``.
ID_FIELDS = ("_id", "id")


@dataclass
class CorpusBatch:
    """Consecutive valid records of the stream: ``positions[i]`` is the stream position of ``ids[i]`` / ``texts[i]``
    (the text a model reads: title + text, :func:`~cde_st.data.document_text`); ``wheres[i]`` names its file and line
    or row, for error messages."""

    positions: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def corpus_kind(path: str | Path) -> str:
    """What ``path`` is: ``"jsonl"``, ``"parquet"``, ``"beir"`` (a folder with ``corpus.jsonl[.gz]``) or
    ``"datasets"`` (a ``save_to_disk`` folder); anything else raises :class:`DataError` saying what is accepted."""
    path = Path(path)
    if path.is_dir():
        if find_jsonl(path, "corpus") is not None:
            return "beir"
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "datasets"
        raise DataError(
            f"{path}: a folder without corpus.jsonl[.gz] (BEIR) nor state.json / dataset_dict.json (a datasets "
            "save_to_disk folder); give one of those, a .jsonl[.gz] file or a .parquet file."
        )
    if not path.exists():
        raise DataError(f"{path}: no such file or folder.")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise DataError(f"{path}: unknown corpus format; give a .jsonl[.gz] or .parquet file, a BEIR or datasets folder.")


class CorpusReader:
    """A corpus read as a stream of :class:`CorpusBatch` (see the module docstring).

    Args:
        path: the corpus (file or folder, :func:`corpus_kind`).
        id_field: the id column (default: the first of :data:`ID_FIELDS` the first record / the schema has).
        text_field: the text column.
        title_field: an optional title column, put before the text (``document_text``); absent or null: no title.
        split: the split of a ``DatasetDict`` folder (needed when it holds several).
        skip_invalid: leave bad records out (counted in :attr:`skipped` by reason) instead of raising.
    """

    def __init__(
        self,
        path: str | Path,
        id_field: str | None = None,
        text_field: str = "text",
        title_field: str | None = "title",
        split: str | None = None,
        skip_invalid: bool = False,
    ) -> None:
        self.path = Path(path)
        self.kind = corpus_kind(self.path)
        self.id_field, self.text_field, self.title_field = id_field, text_field, title_field
        self.split = split
        self.skip_invalid = skip_invalid
        self.skipped: Counter[str] = Counter()
        #: Positions in the stream so far (valid or not) of the last full read: the stream's length after one.
        self.records_seen = 0
        self._files = self._data_files()

    # ------------------------------------------------------------------ files
    def _data_files(self) -> list[Path]:
        if self.kind == "beir":
            return [find_jsonl(self.path, "corpus")]
        if self.kind != "datasets":
            return [self.path]
        folder = self.path
        if (folder / "dataset_dict.json").is_file():
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
            if self.split is None and len(splits) == 1:
                self.split = splits[0]
            if self.split not in splits:
                raise DataError(f"{folder}: a DatasetDict with splits {splits}; choose one (split=...).")
            folder = folder / self.split
        state = json.loads((folder / "state.json").read_text())
        return [folder / entry["filename"] for entry in state["_data_files"]]

    @property
    def files(self) -> list[Path]:
        """The files read, in stream order (one, or the Arrow files of a datasets folder)."""
        return list(self._files)

    def content_digest(self) -> str:
        """SHA-256 (hex) of the bytes of :attr:`files`, in order: what a resumed job compares, since a file edited
        in place can keep its size. One sequential read, about a twentieth of the time a scan takes."""
        digest = hashlib.sha256()
        for path in self._files:
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
        return digest.hexdigest()

    # ------------------------------------------------------------------ records
    def _resolve_id_field(self, names: Any, where: str) -> str:
        if self.id_field is not None:
            return self.id_field
        for candidate in ID_FIELDS:
            if candidate in names:
                self.id_field = candidate
                return candidate
        raise DataError(f"{where}: no id field ({' or '.join(ID_FIELDS)}; found: {', '.join(names) or 'none'}).")

    def _record(self, record: dict, where: str) -> tuple[str, str] | str:
        """(id, text) of one record, or the reason it is invalid."""
        id_field = self._resolve_id_field(list(record), where)
        doc_id, text = record.get(id_field), record.get(self.text_field)
        title = record.get(self.title_field) if self.title_field else None
        if doc_id is None:
            return f"missing id field {id_field!r}"
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            return f"id field {id_field!r} must be a string or integer, got {type(doc_id).__name__}"
        if text is None:
            return f"missing text field {self.text_field!r}"
        if not isinstance(text, str) or not (title is None or isinstance(title, str)):
            return f"text / title must be strings, got {type(text).__name__} / {type(title).__name__}"
        text = document_text(title, text)
        if not text:
            return "empty text"
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"a lone surrogate character at position {exc.start} of the text (not valid Unicode)"
        return str(doc_id), text

    def reject(self, reason: str, where: str, kind: str | None = None) -> None:
        """Raise :class:`DataError` for a bad record at ``where``, or (``skip_invalid``) count it under ``kind``
        (default: the reason's words before any detail in parentheses)."""
        if not self.skip_invalid:
            raise DataError(f"{where}: {reason}. (skip_invalid / --skip-invalid leaves such records out, counted.)")
        self.skipped[kind or reason.split(" (")[0]] += 1

    def records(self) -> Iterator[tuple[int, dict | str, str]]:
        """(position, record or the reason it cannot be read, where) for every record of the stream."""
        position = self.records_seen = 0
        for path in self._files:
            rows = self._jsonl_rows(path) if self.kind in ("jsonl", "beir") else self._table_rows(path)
            for record, where in rows:
                yield position, record, where
                position += 1
                self.records_seen = position

    def batches(self, batch_size: int, start: int = 0, stop: int | None = None) -> Iterator[CorpusBatch]:
        """The valid records of positions [``start``, ``stop``) in batches of at most ``batch_size`` (positions
        before ``start`` are read and passed over, not checked)."""
        batch = CorpusBatch()
        for position, record, where in self.records():
            if position < start:
                continue
            if stop is not None and position >= stop:
                break
            parsed = self._record(record, where) if isinstance(record, dict) else record
            if isinstance(parsed, str):
                self.reject(parsed, where)
                continue
            batch.positions.append(position)
            batch.ids.append(parsed[0])
            batch.texts.append(parsed[1])
            batch.wheres.append(where)
            if len(batch) >= batch_size:
                yield batch
                batch = CorpusBatch()
        if len(batch):
            yield batch

    # ------------------------------------------------------------------ formats
    @staticmethod
    def _jsonl_rows(path: Path) -> Iterator[tuple[dict | str, str]]:
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rb") as handle:
                for lineno, raw in enumerate(handle, start=1):
                    if not raw.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        yield f"not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1})", where
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        yield f"invalid JSON ({err.msg} at column {err.colno})", where
                        continue
                    yield (
                        (
                            record
                            if isinstance(record, dict)
                            else f"expected a JSON object, got {type(record).__name__}"
                        ),
                        where,
                    )
        except (OSError, EOFError) as err:  # truncated / not-gzip files
            raise DataError(f"{path}: cannot be read ({err}).") from err

    def _table_rows(self, path: Path) -> Iterator[tuple[dict, str]]:
        batches = _parquet_batches(path) if self.kind == "parquet" else _arrow_batches(path)
        row = 0
        for record_batch in batches:
            for record in record_batch.to_pylist():
                row += 1
                yield record, f"{path}: row {row}"


#: Rows per Arrow record batch read from a table file (memory per batch, not the embedding batch size).
TABLE_BATCH_ROWS = 4096


def _parquet_batches(path: Path):
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=TABLE_BATCH_ROWS)
    except OSError as err:
        raise DataError(f"{path}: cannot be read as parquet ({err}).") from err


def _arrow_batches(path: Path):
    """A datasets Arrow file (the IPC stream format ``save_to_disk`` writes), memory-mapped, a batch at a time."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
                return
            yield from reader
    except (OSError, pa.ArrowInvalid) as err:
        raise DataError(f"{path}: cannot be read as an Arrow file ({err}).") from err
