"""The live version as an update reads it: each id's content hash, shard and row; whether a new shard is a live one
row for row; stored embeddings read a shard at a time (the last few kept); the ids table removed at the end."""

from __future__ import annotations

import numpy as np
import pytest

from cde_st.corpus.previous_version import PREVIOUS_TABLE, PreviousVersion
from cde_st.corpus.shards import DamagedFileError, content_hash, shard_bytes, shard_name, shard_table, write_shard

SHARD_IDS = [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]


def _vectors(shard: int, rows: int) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * shard


def _folder(tmp_path) -> dict:
    """A folder of four shards (and one empty shard whose file was never written); its manifest."""
    entries = []
    for k, ids in enumerate(SHARD_IDS):
        rows = (ids, [content_hash(i) for i in ids], _vectors(k, len(ids)))
        entries.append(write_shard(tmp_path, shard_name(k), k, 3, rows, "float32"))
    entries.append({"index": 4, "file": shard_name(4), "start": 12, "stop": 15, "rows": 0, "sha256": "none"})
    return {"shards": entries}


def test_ids_are_found_by_shard_and_row_and_the_table_goes_with_the_update(tmp_path):
    with PreviousVersion(tmp_path, _folder(tmp_path)) as previous:
        assert previous.rows == 7 and (tmp_path / PREVIOUS_TABLE).is_file()
        assert previous.lookup(["c", "zz", "d"]) == [(content_hash("c"), 0, 2), None, (content_hash("d"), 1, 0)]
        many = [f"missing-{i}" for i in range(2000)] + ["g"]  # more than one statement's parameters
        assert previous.lookup(many)[-1] == (content_hash("g"), 3, 0) and previous.lookup(many).count(None) == 2000
    assert not (tmp_path / PREVIOUS_TABLE).exists()


def test_a_new_shard_is_kept_whole_only_when_it_is_the_live_shard_row_for_row(tmp_path):
    manifest = _folder(tmp_path)
    with PreviousVersion(tmp_path, manifest) as previous:
        assert previous.whole_shard(0, previous.lookup(["a", "b", "c"])) == manifest["shards"][0]
        assert previous.whole_shard(0, previous.lookup(["a", "c", "b"])) is None  # reordered
        assert previous.whole_shard(0, previous.lookup(["a", "b"])) is None  # a row deleted
        assert previous.whole_shard(1, previous.lookup(["d", "x"])) is None  # a row replaced by a new one
        assert previous.whole_shard(1, previous.lookup(["a", "b"])) is None  # rows of another shard
        assert previous.whole_shard(9, []) is None  # no such live shard


def test_stored_embeddings_are_read_and_the_last_shards_kept(tmp_path):
    with PreviousVersion(tmp_path, _folder(tmp_path)) as previous:
        assert np.array_equal(previous.embeddings(0, [2, 0]), _vectors(0, 3)[[2, 0]])
        for k in (1, 2):
            previous.embeddings(k, [0])
        (tmp_path / shard_name(0)).unlink()
        assert np.array_equal(previous.embeddings(0, [1]), _vectors(0, 3)[[1]])  # kept: read from memory
        previous.embeddings(3, [0])  # a fourth shard pushes out the least recently used (shard 1)
        assert np.array_equal(previous.embeddings(2, [0]), _vectors(2, 1))
        (tmp_path / shard_name(1)).unlink()
        with pytest.raises(DamagedFileError, match=r"shard-000001\.parquet is missing"):
            previous.embeddings(1, [0])


def test_rows_of_a_shard_written_before_content_hashes_have_no_hash(tmp_path):
    manifest = _folder(tmp_path)
    (tmp_path / shard_name(2)).write_bytes(shard_bytes(shard_table(["f"], _vectors(2, 1))))
    with PreviousVersion(tmp_path, manifest) as previous:
        assert previous.lookup(["f", "a"]) == [(None, 2, 0), (content_hash("a"), 0, 0)]
