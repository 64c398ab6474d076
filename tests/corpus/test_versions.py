"""Versions of an embedding folder: versioned names, the files a manifest keeps live, the pending record of a
version being written, and the removal of superseded files (only names a job writes)."""

from __future__ import annotations

from cde_st.corpus.versions import (
    PENDING_FILE,
    VERSION_FILE,
    live_files,
    read_pending,
    remove_superseded,
    versioned_name,
    write_pending,
)


def test_generation_0_keeps_the_plain_name_and_later_ones_insert_the_generation():
    names = ["shard-000003.parquet", "context.safetensors", "index.faiss", "index_ids.parquet"]
    assert [versioned_name(n, 0) for n in names] == names
    assert [versioned_name(n, 2) for n in names] == [
        "shard-000003.v2.parquet",
        "context.v2.safetensors",
        "index.v2.faiss",
        "index_ids.v2.parquet",
    ]
    assert all(VERSION_FILE.fullmatch(versioned_name(n, g)) for n in names for g in (0, 1, 12))


def test_the_live_files_are_every_file_the_manifest_names():
    assert live_files(None) == set() and live_files({}) == set()
    manifest = {
        "shards": [{"file": "shard-000000.v1.parquet"}, {"file": "shard-000001.parquet"}],
        "context": {"fingerprint": "f"},
        "drift": {"reference_file": "drift_reference.v1.safetensors"},
        "index": {"file": "index.v1.faiss", "ids_file": "index_ids.v1.parquet"},
    }
    assert live_files(manifest) == {
        "shard-000000.v1.parquet",
        "shard-000001.parquet",
        "context.safetensors",  # no context_file recorded: the first run's name
        "drift_reference.v1.safetensors",
        "index.v1.faiss",
        "index_ids.v1.parquet",
    }
    plain = {"shards": [{"file": "shard-000000.parquet"}], "context": None, "drift": None, "index": {"file": None}}
    assert live_files(plain) == {"shard-000000.parquet"}
    assert "context.v3.safetensors" in live_files({"context": {"f": 1}, "context_file": "context.v3.safetensors"})


def test_the_pending_record_reads_back_and_an_unreadable_one_is_none(tmp_path):
    assert read_pending(tmp_path) is None  # none written
    pending = {"generation": 2, "shards": [{"file": "shard-000000.v2.parquet"}], "kind": "update"}
    write_pending(tmp_path, pending)
    assert read_pending(tmp_path) == pending
    assert [p.name for p in tmp_path.iterdir()] == [PENDING_FILE]  # no temporary file left
    for junk in (b'{"generation": 2, "sha', b"\xff\xfe", b"[1, 2]"):  # cut short, not text, not a record
        (tmp_path / PENDING_FILE).write_bytes(junk)
        assert read_pending(tmp_path) is None


def test_only_superseded_job_files_are_removed(tmp_path):
    job_files = ["shard-000000.parquet", "shard-000000.v1.parquet", "context.safetensors", "context.v1.safetensors",
                 "index.faiss", "index_ids.v4.parquet", "drift_reference.safetensors"]  # fmt: skip
    others = ["notes.txt", "shard-1.parquet", "manifest.json", PENDING_FILE, "context.npy", "shard-000000.parquet.bak"]
    for name in job_files + others:
        (tmp_path / name).write_text(name)
    (tmp_path / "shard-000009.parquet").mkdir()  # a folder with a job file's name is not a file of the job
    keep = {"shard-000000.v1.parquet", "context.v1.safetensors"}
    removed = remove_superseded(tmp_path, keep)
    assert removed == sorted(set(job_files) - keep)
    assert {p.name for p in tmp_path.iterdir()} == keep | set(others) | {"shard-000009.parquet"}
    assert remove_superseded(tmp_path, keep) == []  # nothing left to remove
