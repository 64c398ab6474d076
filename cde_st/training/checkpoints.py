"""The checkpoints of a run in its output folder: which there are (:func:`checkpoints`), whether one can be resumed
from (:func:`check_checkpoint`: complete, every file readable) and whether it already trained as far as the config
asks (:func:`refuse_to_resume_a_finished_run`). ``output_dir.py`` applies these when a run resumes.
"""

from __future__ import annotations

import glob
import json
import os
import zipfile
from typing import Any

from safetensors import safe_open

from cde_st.training.config import TrainConfig

__all__ = ["CheckpointError", "RunFinishedError", "check_checkpoint", "checkpoints", "refuse_to_resume_a_finished_run"]

# The files of a checkpoint the trainer reads back on resume (torch zip archives / JSON).
_CHECKPOINT_ARCHIVES = ("optimizer.pt", "scheduler.pt")


class CheckpointError(ValueError):
    """A checkpoint to resume from is empty, incomplete or holds a file that cannot be read."""


class RunFinishedError(RuntimeError):
    """A resumed run whose checkpoint already reached the configured length: there is nothing to train."""


def _checkpoint_problem(checkpoint: str) -> str | None:
    """What makes ``checkpoint`` impossible to resume from (None: nothing found): empty, no trainer state, an
    optimizer/scheduler/RNG file that is missing or not a readable torch archive, a trainer state that is not JSON."""
    entries = os.listdir(checkpoint)
    if not entries:
        return "is empty (the run stopped while saving it?)"
    state_path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.exists(state_path):
        return "has no trainer_state.json (it is incomplete)"
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
            raise ValueError("not the trainer's state (no global_step)")
    except (OSError, ValueError) as err:
        return f"holds trainer_state.json, which is corrupt and cannot be read ({err})"
    for name in _CHECKPOINT_ARCHIVES:
        if not os.path.exists(os.path.join(checkpoint, name)):
            return f"has no {name} (resuming would silently restart the optimizer and learning-rate schedule)"
    archives = [*_CHECKPOINT_ARCHIVES, *sorted(n for n in entries if n.startswith("rng_state") and n.endswith(".pth"))]
    for name in archives:
        try:
            with zipfile.ZipFile(os.path.join(checkpoint, name)) as archive:
                bad = archive.testzip()
            if bad is not None:
                raise zipfile.BadZipFile(f"member {bad} fails its checksum")
        except (OSError, zipfile.BadZipFile) as err:
            return f"holds {name}, which is corrupt and cannot be read ({err})"
    for name in sorted(n for n in entries if n.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(checkpoint, name), framework="pt") as weights:
                weights.keys()
        except Exception as err:  # safetensors raises its own error types for a damaged header
            return f"holds {name}, which is corrupt and cannot be read ({err})"
    return None


def check_checkpoint(checkpoint: str, output_dir: str | None = None) -> None:
    """A :class:`CheckpointError` naming the file and what to do when ``checkpoint`` cannot be resumed from."""
    problem = _checkpoint_problem(checkpoint)
    if problem is None:
        return
    others = [] if output_dir is None else [c for c in checkpoints(output_dir) if c != os.path.basename(checkpoint)]
    earlier = next(
        (
            os.path.join(output_dir, c)
            for c in reversed(others)
            if _checkpoint_problem(os.path.join(output_dir, c)) is None
        ),
        None,
    )
    what = (
        f"Resume from the newest readable checkpoint with --resume {earlier} (or delete {checkpoint} and --resume)"
        if earlier
        else "Resume from another checkpoint (--resume PATH), or start the run again (--overwrite-output-dir)"
    )
    raise CheckpointError(f"Cannot resume: checkpoint {checkpoint} {problem}. Nothing was changed. {what}.")


def _trainer_state(checkpoint: str) -> dict[str, Any] | None:
    state_path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.exists(state_path):
        return None
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"Cannot resume: {state_path} is corrupt and cannot be read ({err}). Resume from another checkpoint "
            "(--resume PATH)."
        ) from None
    return state if isinstance(state, dict) else None


def refuse_to_resume_a_finished_run(cfg: TrainConfig, checkpoint: str) -> None:
    """A :class:`RunFinishedError` when ``checkpoint`` already trained as far as ``cfg`` asks (``max_steps``, or
    the epochs the run was planned with): resuming it would train past the end and replace ``final/``."""
    state = _trainer_state(checkpoint)
    if state is None:
        return
    step, planned = state.get("global_step", 0), state.get("max_steps", 0)
    if cfg.max_steps > 0:
        finished, target = step >= cfg.max_steps, f"max_steps = {cfg.max_steps}"
    else:
        epochs = state.get("num_train_epochs", cfg.num_train_epochs)
        finished = planned > 0 and step >= planned and cfg.num_train_epochs <= epochs
        target = f"num_train_epochs = {cfg.num_train_epochs:g} ({planned} steps)"
    if finished:
        raise RunFinishedError(
            f"The run in {cfg.output_dir} is finished: {checkpoint} is at step {step}, and the config asks for "
            f"{target}. Nothing was changed. To train further, resume with a larger max_steps or num_train_epochs "
            "(--set max_steps=N)."
        )


def checkpoints(folder: str) -> list[str]:
    """The names of the ``checkpoint-N`` folders in ``folder``, in step order (the last is the newest)."""
    found = glob.glob(os.path.join(glob.escape(folder), "checkpoint-*"))
    return sorted((os.path.basename(p) for p in found if os.path.isdir(p)), key=lambda n: (len(n), n))
