"""cde_st.folders: a model folder is written beside its place and renamed in, so no process sees half of it."""

from __future__ import annotations

import pytest

from cde_st.folders import write_folder_atomically


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
