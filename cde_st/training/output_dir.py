"""The output folder of a run: what a new run refuses to overwrite, what a resumed run must keep, and what
``overwrite_output_dir`` may remove.

A folder that already holds a run (checkpoints, a final model or a summary) is refused unless the run is resumed
or ``overwrite_output_dir`` replaces it; a resumed run must have the config its checkpoints were trained with
(except :data:`RESUMABLE_FIELDS`), a finished run is left as it is, and overwriting never removes an input of the
new run.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from typing import Any

from cde_st.training.config import TrainConfig, TrainConfigError

logger = logging.getLogger(__name__)


RESUMABLE_FIELDS = frozenset(
    {
        "max_steps",
        "num_train_epochs",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "eval_steps",
        "dataloader_num_workers",
        "output_dir",
    }
)
# What a run writes into its output folder (removed by ``overwrite_output_dir``; other files are left alone).
_RUN_OUTPUTS = ("checkpoint-*", "final", "train_summary.json", "train_config.json", "_tiny_base")


class OutputDirError(FileExistsError):
    """The output folder holds an earlier run, and neither resuming nor overwriting it was asked for."""


class ResumeConfigError(TrainConfigError):
    """A resumed run's config differs from the one its checkpoints were trained with."""


class RunFinishedError(RuntimeError):
    """A resumed run whose checkpoint already reached the configured length: there is nothing to train."""


def refuse_to_resume_a_finished_run(cfg: TrainConfig, checkpoint: str) -> None:
    """A :class:`RunFinishedError` when ``checkpoint`` already trained as far as ``cfg`` asks (``max_steps``, or
    the epochs the run was planned with): resuming it would train past the end and replace ``final/``."""
    state_path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.exists(state_path):
        return
    with open(state_path, encoding="utf-8") as f:
        state = json.load(f)
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


def _changed_fields(previous: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """``field: old -> new`` for each field of ``cfg`` that differs from a saved ``train_config.json``."""
    current = json.loads(json.dumps(cfg.to_dict()))  # tuples -> lists, as stored
    defaults = json.loads(json.dumps(TrainConfig().to_dict()))
    changed = []
    for key, value in current.items():
        if key in RESUMABLE_FIELDS:
            continue
        old = previous.get(key, defaults[key])  # a field added since the run started had its default
        if old != value:
            changed.append(f"{key}: {old!r} -> {value!r}")
    return changed


def _input_paths(cfg: TrainConfig) -> dict[str, str]:
    """Every local path the run reads, by the config field that names it."""
    named = {"init_from": cfg.init_from, "base_model": cfg.base_model, "surrogate": cfg.surrogate, "guide": cfg.guide}
    named["eval_folder"] = cfg.eval_folder
    for i, source in enumerate(cfg.train_data):
        if source.startswith("beir:"):
            source = source[len("beir:") :].partition(":")[0]
        named[f"train_data[{i}]"] = source
    return {key: path for key, path in named.items() if path and os.path.exists(path)}


def _refuse_to_remove_inputs(cfg: TrainConfig, doomed: list[str]) -> None:
    """An :class:`OutputDirError` when overwriting the output folder would remove one of the run's inputs (e.g.
    ``init_from: OUT/final`` with ``overwrite_output_dir``): the run would delete what it is about to read."""
    for key, path in _input_paths(cfg).items():
        real = os.path.realpath(path)
        for victim in doomed:
            gone = os.path.realpath(victim)
            if real == gone or real.startswith(gone.rstrip(os.sep) + os.sep):
                raise OutputDirError(
                    f"overwrite_output_dir (--overwrite-output-dir) would remove {victim}, which holds the run's input "
                    f"{key}: {path}. Nothing was removed. Copy that input elsewhere first, or train into a new "
                    "output_dir (--output-dir)."
                )


def prepare_output_dir(
    cfg: TrainConfig,
    resume: bool | str = False,
    overwrite_output_dir: bool = False,
    allow_config_change: bool = False,
) -> None:
    """Make ``cfg.output_dir`` ready for a run and write its ``train_config.json``.

    An output folder that already holds a run (checkpoints, a final model or a summary) is refused unless the run
    is resumed or ``overwrite_output_dir`` removes that run's outputs first. A resumed run must have the config its
    checkpoints were trained with, except :data:`RESUMABLE_FIELDS` (how long to train, what to log and keep) or
    with ``allow_config_change``; otherwise a :class:`ResumeConfigError` lists the changed fields.
    """
    out = cfg.output_dir
    if resume and overwrite_output_dir:
        raise ValueError("Choose one of resume (--resume) and overwrite_output_dir (--overwrite-output-dir).")
    config_path = os.path.join(out, "train_config.json")
    if resume:
        checkpoint_dir = resume if isinstance(resume, str) else None
        if checkpoint_dir is None and not checkpoints(out):
            raise FileNotFoundError(f"Cannot resume: {out} holds no checkpoint-* folder (nothing was saved there yet).")
        if checkpoint_dir is not None and not os.path.isdir(checkpoint_dir):
            raise FileNotFoundError(f"Cannot resume: checkpoint folder {checkpoint_dir} does not exist.")
        candidates = [config_path]
        if checkpoint_dir is not None:
            candidates.append(os.path.join(os.path.dirname(os.path.abspath(checkpoint_dir)), "train_config.json"))
        previous_path = next((p for p in candidates if os.path.exists(p)), None)
        if previous_path is not None and not allow_config_change:
            with open(previous_path, encoding="utf-8") as f:
                changed = _changed_fields(json.load(f), cfg)
            if changed:
                raise ResumeConfigError(
                    f"Cannot resume with a changed config: the run's checkpoints were trained with {previous_path}, "
                    f"which differs in {len(changed)} field(s):\n  " + "\n  ".join(changed) + "\n"
                    "Resume with the same config, train into a new --output-dir, or pass allow_config_change=True "
                    "(--allow-config-change) to resume with these changes anyway."
                )
        refuse_to_resume_a_finished_run(cfg, checkpoint_dir or os.path.join(out, checkpoints(out)[-1]))
    else:
        earlier = checkpoints(out) if os.path.isdir(out) else []
        earlier += [n for n in ("final", "train_summary.json") if os.path.exists(os.path.join(out, n))]
        if earlier and not overwrite_output_dir:
            raise OutputDirError(
                f"Output folder {out} already holds a training run ({', '.join(earlier)}). Pass resume=True "
                "(--resume) to continue it, overwrite_output_dir=True (--overwrite-output-dir) to replace it, or "
                "choose a new output_dir (--output-dir)."
            )
        if overwrite_output_dir and os.path.isdir(out):
            doomed = [p for pattern in _RUN_OUTPUTS for p in glob.glob(os.path.join(glob.escape(out), pattern))]
            _refuse_to_remove_inputs(cfg, doomed)
            for path in doomed:
                logger.warning("overwrite_output_dir: removing %s", path)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(out, exist_ok=True)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=2)
