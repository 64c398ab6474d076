"""cde_st.training.checkpoints: which checkpoints a folder holds, whether one can be resumed from, whether it is done."""

from __future__ import annotations

import json
import zipfile

import pytest

from cde_st.training import TrainConfig
from cde_st.training.checkpoints import (
    CheckpointError,
    RunFinishedError,
    check_checkpoint,
    checkpoints,
    refuse_to_resume_a_finished_run,
)


def _checkpoint(folder, step, max_steps=10):
    """A checkpoint folder as the trainer writes it, as far as resuming reads it."""
    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps}))
    for name in ("optimizer.pt", "scheduler.pt"):
        with zipfile.ZipFile(checkpoint / name, "w") as archive:
            archive.writestr("data.pkl", b"state")
    return checkpoint


def test_checkpoints_are_listed_in_step_order(tmp_path):
    for step in (10, 9, 100):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-notes.txt").write_text("a file, not a checkpoint")
    assert checkpoints(str(tmp_path)) == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]


def test_a_corrupt_checkpoint_is_refused_naming_the_file_and_the_newest_readable_one(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    broken = _checkpoint(tmp_path, 6)
    (broken / "scheduler.pt").write_bytes(b"not a zip archive")
    with pytest.raises(CheckpointError, match=r"checkpoint-6 holds scheduler\.pt, which is corrupt.*checkpoint-4"):
        check_checkpoint(str(broken), str(tmp_path))
    check_checkpoint(str(tmp_path / "checkpoint-4"), str(tmp_path))  # whole: no error
    (tmp_path / "checkpoint-4" / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"checkpoint-4 has no optimizer\.pt"):
        check_checkpoint(str(tmp_path / "checkpoint-4"))


def test_a_checkpoint_that_reached_max_steps_is_finished(tmp_path):
    checkpoint = _checkpoint(tmp_path, 10)
    with pytest.raises(RunFinishedError, match=r"step 10.*max_steps = 10"):
        refuse_to_resume_a_finished_run(TrainConfig(output_dir=str(tmp_path), max_steps=10), str(checkpoint))
    refuse_to_resume_a_finished_run(TrainConfig(output_dir=str(tmp_path), max_steps=12), str(checkpoint))
