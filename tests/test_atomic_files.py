"""cde_st.atomic_files: a file or a model folder is written beside its place and renamed in, so no process sees half
of it, and a write that fails leaves the old version and no temporary file."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from cde_st import atomic_files
from cde_st.atomic_files import TEMP_PREFIX, write_atomically, write_folder_atomically


def test_a_file_is_replaced_whole_and_no_temporary_file_is_left(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old")
    assert write_atomically(path, '{"new": "é"}') == path  # text goes out as UTF-8
    assert path.read_bytes() == '{"new": "é"}'.encode()
    write_atomically(str(path), b"\x00bytes", fsync=False)
    assert path.read_bytes() == b"\x00bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_writer_function_gets_the_open_file(tmp_path):
    path = tmp_path / "arrays.npz"
    write_atomically(path, lambda f: np.savez(f, labels=np.arange(3)))
    with np.load(path) as data:
        assert data["labels"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["arrays.npz"]  # np.savez appended no ".npz" anywhere


def test_a_crash_before_the_rename_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old")
    seen = []

    def crash():
        seen.extend(p.name for p in tmp_path.iterdir())  # the new version is complete beside the old one
        raise KeyboardInterrupt  # any BaseException, as a kill signal's handler would raise

    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, "new", before_replace=crash)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    assert len(seen) == 2 and any(name.startswith(f"{TEMP_PREFIX}manifest.json-") for name in seen)


def test_a_failing_writer_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "cache.npz"
    path.write_bytes(b"old")

    def half(f):
        f.write(b"half a file")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["cache.npz"]


def test_fsync_flushes_the_file_and_then_its_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(atomic_files.os, "fsync", fsync)
    write_atomically(tmp_path / "a", "x")
    assert synced == ["file", "folder"]
    synced.clear()
    write_atomically(tmp_path / "b", "x", fsync=False)
    assert synced == []


def test_the_folder_appears_whole_and_no_staging_folder_is_left(tmp_path):
    def write(staging):
        assert not (tmp_path / "models" / "m").exists()  # nothing at the final place while writing
        (staging / "config.json").write_text("{}")
        (staging / "weights.bin").write_bytes(b"x")

    folder = write_folder_atomically(tmp_path / "models" / "m", write)
    assert folder == tmp_path / "models" / "m"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "weights.bin"]
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["m"]


def test_a_folder_another_process_finished_first_is_kept(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text('{"first": true}')
    (target / "extra").write_text("x")  # a non-empty folder: the rename cannot replace it

    write_folder_atomically(target, lambda staging: (staging / "config.json").write_text('{"first": false}'))
    assert (target / "config.json").read_text() == '{"first": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    def write(staging):
        (staging / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_folder_atomically(tmp_path / "m", write)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def umask_027():
    """A umask other than the usual 022, so a mode that happens to match by default proves nothing."""
    previous = os.umask(0o027)
    yield 0o027
    os.umask(previous)


def test_what_a_write_leaves_gets_the_umask_s_mode(tmp_path, umask_027):
    """tempfile (and safetensors through it) makes 0o600 files and 0o700 folders: another user could then not load
    a saved model."""
    import tempfile

    assert atomic_files.umask() == umask_027

    def private_writer(path: str) -> None:  # as safetensors' save_file writes: a 0o600 temporary file renamed
        handle, temp = tempfile.mkstemp(dir=os.path.dirname(path))
        os.write(handle, b"weights")
        os.close(handle)
        os.replace(temp, path)

    assert stat.S_IMODE(write_atomically(tmp_path / "a.json", "{}").stat().st_mode) == 0o640
    written = atomic_files.write_path_atomically(tmp_path / "model.safetensors", private_writer, fsync=False)
    assert written.read_bytes() == b"weights" and stat.S_IMODE(written.stat().st_mode) == 0o640

    def folder_writer(staging):
        private_writer(str(staging / "model.safetensors"))
        (staging / "sub").mkdir(mode=0o700)

    folder = write_folder_atomically(tmp_path / "model", folder_writer)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750  # mkdtemp's 0o700 before
    assert stat.S_IMODE((folder / "sub").stat().st_mode) == 0o750
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "model", "model.safetensors"]


def test_a_writer_that_fails_leaves_no_temporary_file(tmp_path):
    def failing(path: str) -> None:
        open(path, "wb").close()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_files.write_path_atomically(tmp_path / "model.safetensors", failing)
    assert list(tmp_path.iterdir()) == []
