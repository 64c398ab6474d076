"""Shards: each storage dtype reads back as written (int8 to within half a step per row), the manifest entry and
its SHA-256, content hashes read without the embeddings, and a missing or altered shard named."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from cde_st.corpus.shards import (
    DamagedFileError,
    content_hash,
    read_shard,
    read_shard_keys,
    shard_bytes,
    shard_name,
    shard_table,
    write_atomically,
    write_shard,
)

IDS = ["a", "b", "c", "d"]


def _vectors() -> np.ndarray:
    vectors = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    vectors[1] *= 100  # rows of other scales: int8 keeps a scale per row
    vectors[2] = 0  # an all-zero row reads back as zeros, not NaN
    return vectors


def test_names_and_content_hashes():
    assert shard_name(3) == "shard-000003.parquet" and shard_name(1234567) == "shard-1234567.parquet"
    digest = content_hash("title text")
    assert len(digest) == 16 and digest == content_hash("title text")
    assert content_hash("title text.") != digest and content_hash("") != digest


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 0.0), ("float16", 1e-3)])
def test_float_shards_read_back_as_written(tmp_path, dtype, tolerance):
    vectors = _vectors()
    path = tmp_path / "s.parquet"
    path.write_bytes(shard_bytes(shard_table(IDS, vectors, dtype)))
    ids, read = read_shard(path)
    assert ids == IDS and read.dtype == np.float32
    np.testing.assert_allclose(read, vectors, rtol=tolerance, atol=0)


def test_int8_shards_keep_each_row_to_half_a_step(tmp_path):
    vectors = _vectors()
    path = tmp_path / "s.parquet"
    path.write_bytes(shard_bytes(shard_table(IDS, vectors, "int8")))
    _, read = read_shard(path)
    step = np.abs(vectors).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(read - vectors) <= step / 2 + 1e-6)
    assert np.abs(read - vectors).max() > 0  # quantised, not stored exactly
    assert np.array_equal(read[2], np.zeros(6, np.float32))


def test_an_unknown_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float16', 'int8'\), got 'int4'"):
        shard_table(IDS, _vectors(), "int4")


def test_a_written_shard_is_recorded_with_its_positions_and_sha256(tmp_path):
    hashes = [content_hash(i) for i in IDS]
    entry = write_shard(tmp_path, shard_name(2), 2, 10, (IDS, hashes, _vectors()), "float16")
    path = tmp_path / "shard-000002.parquet"
    assert entry == {
        "index": 2,
        "file": "shard-000002.parquet",
        "start": 20,
        "stop": 30,
        "rows": 4,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    assert read_shard_keys(path) == (IDS, hashes)
    ids, read = read_shard(path, entry["sha256"])
    assert ids == IDS and np.allclose(read, _vectors(), rtol=1e-3)


def test_a_shard_written_before_content_hashes_has_none(tmp_path):
    path = tmp_path / "s.parquet"
    path.write_bytes(shard_bytes(shard_table(IDS, _vectors())))
    assert read_shard_keys(path) == (IDS, [None] * 4)


def test_a_missing_or_altered_shard_is_named_with_how_to_write_it_again(tmp_path):
    path = tmp_path / "s.parquet"
    digest = write_atomically(path, shard_bytes(shard_table(IDS, _vectors())))
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40  # among the values: parquet may read it back without an error
    path.write_bytes(bytes(data))
    rewrite = "Rerun cde-st-embed with the same arguments to write it again"
    with pytest.raises(DamagedFileError, match=rf"Shard {path} does not match the SHA-256 .*{rewrite}"):
        read_shard(path, digest)
    path.unlink()
    with pytest.raises(DamagedFileError, match=rf"Shard {path} is missing\. {rewrite}"):
        read_shard(path, digest)
