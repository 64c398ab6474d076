"""The output folder: a folder no job wrote is refused and left alone, the lock goes with the job, and a folder that
cannot be written, or is a file, or a corpus with nothing to embed, is one clear message."""

from __future__ import annotations

import builtins
import os

import numpy as np
import pytest
from corpus_helpers import DOCS, write_jsonl

from cde_st.corpus import CorpusContext, embed_corpus
from cde_st.corpus.output_folder import FolderBusyError, OutputFolder
from cde_st.data import DataError


def test_a_non_empty_folder_no_job_wrote_is_refused_and_left_as_it_was(tiny_plain, corpus_file, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    names = [".tmp-notes", ".ids.sqlite", "index.faiss", "shard-000000.parquet", "context.safetensors", "notes.txt"]
    for name in names:
        (out / name).write_bytes(f"the user's {name}".encode())
    with pytest.raises(FileExistsError, match=r"mine is not empty and is not a cde-st-embed folder.*index\.faiss"):
        embed_corpus(tiny_plain, corpus_file, out, show_progress_bar=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # nothing removed, nothing added (no .lock)
    assert all((out / name).read_bytes() == f"the user's {name}".encode() for name in names)


def test_a_jobs_folder_keeps_files_the_job_did_not_write_and_loses_its_lock(tiny_plain, corpus_file, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_plain, corpus_file, out, show_progress_bar=False)
    assert not (out / ".lock").exists()
    (out / ".tmp-notes").write_text("the user's")
    (out / ".tmp-shard-000000.parquet.123").write_text("left by a crash")
    embed_corpus(tiny_plain, corpus_file, out, show_progress_bar=False)
    assert (out / ".tmp-notes").read_text() == "the user's"
    assert not (out / ".tmp-shard-000000.parquet.123").exists() and not (out / ".lock").exists()


def test_a_folder_of_a_job_stopped_before_its_first_manifest_is_taken(tiny_plain, corpus_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in (".lock", ".ids.sqlite", ".tmp-manifest.json.4242"):
        (out / name).write_bytes(b"left by a killed job")
    CorpusContext(np.ones((2, 32), np.float32), "sample", {"source": "sample"}).save(out / "context.safetensors")
    manifest = embed_corpus(tiny_plain, corpus_file, out, show_progress_bar=False)
    assert manifest["complete"] and not (out / ".tmp-manifest.json.4242").exists()


def test_an_output_folder_that_is_a_file_or_cannot_be_written_is_named(tiny_plain, corpus_file, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=r"output folder .*afile is a file"):
        embed_corpus(tiny_plain, corpus_file, tmp_path / "afile", show_progress_bar=False)
    with pytest.raises(NotADirectoryError, match=r"output folder .*afile/sub: part of its path is a file"):
        embed_corpus(tiny_plain, corpus_file, tmp_path / "afile" / "sub", show_progress_bar=False)
    locked = tmp_path / "read-only"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: fail writes there as the kernel would for another user
        real_open, real_mkdir = builtins.open, os.mkdir

        def refuse(path, *args, **kwargs):
            if str(path).startswith(str(locked)):
                raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(builtins, "open", lambda p, *a, **k: refuse(p) or real_open(p, *a, **k))
        monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: refuse(p) or real_mkdir(p, *a, **k))
    try:
        for out in (locked, locked / "new"):
            with pytest.raises(PermissionError, match=rf"Cannot write in the output folder {out} \(Permission denied"):
                embed_corpus(tiny_plain, corpus_file, out, show_progress_bar=False)
    finally:
        locked.chmod(0o755)


def test_an_empty_corpus_is_one_message_naming_it_and_leaves_no_lock(tiny_cde, tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match=r"empty\.jsonl: the corpus has no records"):
        embed_corpus(tiny_cde, empty, tmp_path / "new", show_progress_bar=False)
    assert not (tmp_path / "new").exists()  # created by the job, removed with its lock
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataError, match=r"empty\.jsonl: the corpus has no records"):
        embed_corpus(tiny_cde, empty, tmp_path / "mine", show_progress_bar=False)
    assert list((tmp_path / "mine").iterdir()) == []
    blank = write_jsonl(tmp_path / "blank.jsonl", [{**DOCS[0], "title": "", "text": " "}, {"_id": "x"}])
    with pytest.raises(DataError, match=r"blank\.jsonl: none of the corpus's 2 records is valid"):
        embed_corpus(tiny_cde, blank, tmp_path / "new", skip_invalid=True, show_progress_bar=False)


def test_one_job_at_a_time_holds_a_folder(tmp_path):
    with OutputFolder(tmp_path / "out"):
        with pytest.raises(FolderBusyError, match="Another cde-st-embed job is writing"):
            OutputFolder(tmp_path / "out").__enter__()
    with OutputFolder(tmp_path / "out"):  # the lock went with the first job
        assert (tmp_path / "out" / ".lock").exists()
    assert not (tmp_path / "out" / ".lock").exists()
