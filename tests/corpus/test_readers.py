"""Reading a corpus as a stream: every format gives the same records, and each bad record is named by file and line."""

from __future__ import annotations

import json

import pytest
from corpus_helpers import DOCS, write_jsonl

from cde_st.corpus import CorpusReader
from cde_st.corpus.readers import TABLE_BATCH_ROWS
from cde_st.data import DataError, document_text

EXPECTED = [(d["_id"], document_text(d["title"], d["text"])) for d in DOCS]


def records(path, **options):
    reader = CorpusReader(path, **options)
    return [(i, t) for batch in reader.batches(7) for i, t in zip(batch.ids, batch.texts)]


def test_every_format_streams_the_same_records(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "c.jsonl.gz", DOCS)
    (tmp_path / "beir").mkdir()
    write_jsonl(tmp_path / "beir" / "corpus.jsonl", DOCS)
    pq.write_table(pa.Table.from_pylist(DOCS), tmp_path / "c.parquet", row_group_size=16)
    datasets.Dataset.from_list(DOCS).save_to_disk(str(tmp_path / "ds"), max_shard_size="2KB")
    datasets.DatasetDict({"corpus": datasets.Dataset.from_list(DOCS)}).save_to_disk(str(tmp_path / "dd"))
    assert len(list((tmp_path / "ds").glob("*.arrow"))) > 1  # several Arrow files are read in order
    for path in ("c.jsonl.gz", "beir", "c.parquet", "ds", "dd"):
        assert records(tmp_path / path) == EXPECTED, path


def test_batches_are_bounded_and_positions_count_every_record(tmp_path):
    rows = [*DOCS[:3], "not json", *DOCS[3:5]]
    reader = CorpusReader(write_jsonl(tmp_path / "c.jsonl", rows), skip_invalid=True)
    batches = list(reader.batches(2))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert [p for b in batches for p in b.positions] == [0, 1, 2, 4, 5]
    assert reader.records_seen == 6 and dict(reader.skipped) == {"invalid JSON": 1}


def test_tables_are_read_a_batch_at_a_time(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen = []
    original = pq.ParquetFile.iter_batches

    def iter_batches(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            seen.append(batch.num_rows)
            yield batch

    monkeypatch.setattr("cde_st.corpus.readers.TABLE_BATCH_ROWS", 10)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    pq.write_table(pa.Table.from_pylist(DOCS), tmp_path / "c.parquet")
    assert records(tmp_path / "c.parquet") == EXPECTED
    assert len(seen) == 6 and max(seen) == 10 < TABLE_BATCH_ROWS


@pytest.mark.parametrize(
    "line, message",
    [
        (b"{not json", "invalid JSON"),
        (b'{"_id": "x", "text": "caf\xe9"}', "not UTF-8 text"),
        (json.dumps({"_id": "x", "text": "  "}).encode(), "empty text"),
        (json.dumps({"text": "no id"}).encode(), "missing id field '_id'"),
        (json.dumps({"_id": "x", "title": "t"}).encode(), "missing text field 'text'"),
        (json.dumps({"_id": ["x"], "text": "t"}).encode(), "id field '_id' must be a string or integer"),
        (b"[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_record_is_named_by_file_and_line_or_skipped_and_counted(tmp_path, line, message):
    path = write_jsonl(tmp_path / "c.jsonl", [*DOCS[:2], line, DOCS[2]])
    with pytest.raises(DataError, match=rf"c\.jsonl:3: {message}"):
        records(path)
    reader = CorpusReader(path, skip_invalid=True)
    assert [i for b in reader.batches(10) for i in b.ids] == ["d0", "d1", "d2"]
    assert sum(reader.skipped.values()) == 1


def test_a_bad_parquet_row_is_named_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": "a", "text": "x"}, {"id": "b", "text": ""}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: row 2: empty text"):
        records(tmp_path / "c.parquet")


def test_an_unknown_corpus_is_refused_saying_what_is_accepted(tmp_path):
    (tmp_path / "c.csv").write_text("id,text\n")
    with pytest.raises(DataError, match="unknown corpus format"):
        CorpusReader(tmp_path / "c.csv")
    with pytest.raises(DataError, match="no such file"):
        CorpusReader(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="BEIR"):
        CorpusReader(tmp_path / "empty")
