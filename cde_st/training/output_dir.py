"""The output folder of a run: what a new run refuses to overwrite, what a resumed run must keep, and what
``overwrite_output_dir`` may remove.

A folder belongs to one run at a time: a running run holds :data:`LOCK_FILE` in it (:func:`run_lock`), and a second
run into the same folder is refused naming the holder. A folder that already holds a run (checkpoints, a final model
or a summary) is refused unless the run is resumed or ``overwrite_output_dir`` replaces it; a resumed run must have
the config its checkpoints were trained with (except :data:`RESUMABLE_FIELDS`) and checkpoint files that can be read,
a finished run is left as it is, and overwriting removes only what a run wrote (listed in :data:`MANIFEST_FILE`),
never an input of the new run nor anything else. Which checkpoints a folder holds and whether one can be resumed
from: ``checkpoints.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

from cde_st.atomic_files import write_atomically
from cde_st.training.checkpoints import check_checkpoint, checkpoints, refuse_to_resume_a_finished_run
from cde_st.training.config import TrainConfig, TrainConfigError
from cde_st.training.data_record import DATA_RECORD_FILE, check_data_unchanged, data_record, write_data_record

__all__ = [
    "LOCK_FILE",
    "MANIFEST_FILE",
    "RESUMABLE_FIELDS",
    "OutputDirError",
    "OutputDirInUseError",
    "ResumeConfigError",
    "prepare_output_dir",
    "record_outputs",
    "run_lock",
]

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
# The names a run writes into its output folder. Overwriting removes those of them the folder's manifest lists.
_RUN_OUTPUTS = ("checkpoint-*", "final", "train_summary.json", "train_config.json", DATA_RECORD_FILE, "_tiny_base")
#: Held by the run that is training into the folder (pid, host, start time, command); removed when it ends.
LOCK_FILE = "cde_st_run.lock"
#: What the runs in this folder wrote (``{"outputs": [names]}``): all that ``overwrite_output_dir`` may remove.
MANIFEST_FILE = "cde_st_outputs.json"


class OutputDirError(FileExistsError):
    """The output folder holds an earlier run, and neither resuming nor overwriting it was asked for."""


class OutputDirInUseError(OutputDirError):
    """Another training run holds the output folder (its :data:`LOCK_FILE`)."""


class ResumeConfigError(TrainConfigError):
    """A resumed run's config differs from the one its checkpoints were trained with."""


# ----------------------------------------------------------------------------------------- one run per folder
def _lock_record(command: str | None) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
    }


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _describe_holder(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}, "
        f"command: {holder.get('command', '?')}"
    )


def _take_lock(path: str, record: dict[str, Any]) -> bool:
    """Create ``path`` holding ``record`` if no one holds it (atomic: O_CREAT | O_EXCL); False if it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    return True


@contextlib.contextmanager
def run_lock(output_dir: str, command: str | None = None) -> Iterator[None]:
    """Hold ``output_dir`` for one run: :data:`LOCK_FILE` is created atomically in it (pid, host, start time,
    command) and removed at the end. A folder another run holds is an :class:`OutputDirInUseError` naming that run;
    the lock of a process that no longer runs on this host is taken over, with a warning (a run that was killed)."""
    _refuse_a_file(output_dir)
    created = not os.path.isdir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    record = _lock_record(command)
    unreadable_tries = 0
    while not _take_lock(path, record):
        try:
            with open(path, encoding="utf-8") as f:
                holder = json.load(f)
        except FileNotFoundError:  # released in between: try again
            continue
        except (OSError, ValueError):
            holder = {}
        if not isinstance(holder, dict):
            holder = {}
        if not holder and unreadable_tries < 3:  # a lock being written this very moment
            unreadable_tries += 1
            time.sleep(0.2)
            continue
        same_host = holder.get("host") == socket.gethostname()
        if same_host and not _pid_alive(holder.get("pid")):
            logger.warning(
                "%s: the run that held this folder (%s) is no longer running; taking it over.",
                path,
                _describe_holder(holder),
            )
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue  # two runs taking over at once: O_EXCL lets one of them win
        if holder:
            who = f"another training run: {_describe_holder(holder)}"
        else:
            who = "a run whose lock cannot be read"
        raise OutputDirInUseError(
            f"Output folder {output_dir} is in use by {who} (lock file {path}). Two runs in one folder would mix "
            "their checkpoints and final model. Wait for it to finish, or choose another output_dir (--output-dir). "
            f"If that run is gone (killed on another machine), delete {path} and start again."
        )
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            with open(path, encoding="utf-8") as f:
                mine = json.load(f)
            if mine.get("pid") == record["pid"] and mine.get("started") == record["started"]:
                os.remove(path)
        if created:  # a run refused before it wrote anything leaves no folder behind
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)


# -------------------------------------------------------------------------------------- what a run wrote
def _read_manifest(output_dir: str) -> dict[str, Any] | None:
    path = os.path.join(output_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise OutputDirError(
            f"{path} (the list of what earlier runs wrote here) cannot be read ({err}); without it, cde_st cannot "
            "tell its outputs from yours. Nothing was removed. Move what you want to keep elsewhere and remove the "
            "folder's run outputs yourself, or choose a new output_dir (--output-dir)."
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), list):
        raise OutputDirError(f'{path} is not a cde_st output manifest (expected {{"outputs": [...]}}).')
    return manifest


def record_outputs(output_dir: str, *names: str) -> None:
    """Add ``names`` (entries of ``output_dir``) to the folder's :data:`MANIFEST_FILE`, before or as the run writes
    them: what is listed there is what ``overwrite_output_dir`` may remove."""
    manifest = _read_manifest(output_dir) or {"written_by": "cde_st", "outputs": []}
    new = [n for n in names if n not in manifest["outputs"]]
    if not new:
        return
    manifest["outputs"] = [*manifest["outputs"], *new]
    write_atomically(os.path.join(output_dir, MANIFEST_FILE), json.dumps(manifest, indent=2), fsync=False)


def _is_older_cde_st_run(output_dir: str) -> bool:
    """A folder of a cde_st version that wrote no manifest: its train_config.json is a TrainConfig dict."""
    path = os.path.join(output_dir, "train_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "output_dir" in saved and "train_data" in saved


def _refuse_a_file(output_dir: str) -> None:
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise OutputDirError(
            f"output_dir {output_dir} is a file, not a folder: a run writes its checkpoints and final model into a "
            "folder. Nothing was changed. Choose a folder path (--output-dir DIR)."
        )


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
    allow_changed_data: bool = False,
) -> None:
    """Make ``cfg.output_dir`` ready for a run; write its ``train_config.json`` and ``train_data.json`` (its files).

    An output folder that already holds a run (checkpoints, a final model or a summary) is refused unless the run
    is resumed or ``overwrite_output_dir`` removes that run's outputs first: only what the folder's
    :data:`MANIFEST_FILE` lists (or, in a folder an older cde_st wrote, its run outputs); anything else of the
    same names stops the overwrite before anything is removed. A resumed run must have the config its checkpoints
    were trained with, except :data:`RESUMABLE_FIELDS` (how long to train, what to log and keep) or with
    ``allow_config_change``; otherwise a :class:`ResumeConfigError` lists the changed fields. The checkpoint it
    resumes from must be complete and readable (:func:`check_checkpoint`), and its training files those the run
    recorded, unless ``allow_changed_data`` (:func:`~cde_st.training.data_record.check_data_unchanged`).
    """
    out = cfg.output_dir
    if resume and overwrite_output_dir:
        raise ValueError("Choose one of resume (--resume) and overwrite_output_dir (--overwrite-output-dir).")
    _refuse_a_file(out)
    config_path = os.path.join(out, "train_config.json")
    data = data_record(cfg)  # hashed once: checked on resume, then recorded
    if resume:
        _check_resume(cfg, resume, allow_config_change, allow_changed_data, data)
    else:
        _refuse_or_overwrite_an_earlier_run(cfg, overwrite_output_dir)
    os.makedirs(out, exist_ok=True)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=2)
    write_data_record(out, data)
    written = ["train_config.json", DATA_RECORD_FILE]
    if "tiny" in (cfg.base_model, cfg.surrogate, cfg.guide):
        written.append("_tiny_base")
    record_outputs(out, *written)


def _check_resume(
    cfg: TrainConfig, resume: bool | str, allow_config_change: bool, allow_changed_data: bool, data: dict[str, Any]
) -> None:
    """What a resumed run needs (see :func:`prepare_output_dir`): a checkpoint to resume from (``resume``: its path,
    or True for the folder's newest), the config it was trained with, a checkpoint that is whole and not finished,
    the training files the run recorded. A folder an older cde_st wrote adopts its outputs in the manifest."""
    out = cfg.output_dir
    checkpoint_dir = resume if isinstance(resume, str) else None
    if checkpoint_dir is None and not checkpoints(out):
        raise FileNotFoundError(f"Cannot resume: {out} holds no checkpoint-* folder (nothing was saved there yet).")
    if checkpoint_dir is not None and not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"Cannot resume: checkpoint folder {checkpoint_dir} does not exist.")
    checkpoint = checkpoint_dir or os.path.join(out, checkpoints(out)[-1])
    if not allow_config_change:
        _refuse_a_changed_config(cfg, checkpoint_dir)
    check_checkpoint(checkpoint, out if checkpoint_dir is None else os.path.dirname(os.path.abspath(checkpoint)))
    refuse_to_resume_a_finished_run(cfg, checkpoint)
    check_data_unchanged(data, [out, os.path.dirname(os.path.abspath(checkpoint))], allow_changed_data)
    if _read_manifest(out) is None and _is_older_cde_st_run(out):
        # A run of an older cde_st listed nothing; what it wrote is the resumed run's too.
        record_outputs(out, *_run_output_names(out))


def _refuse_a_changed_config(cfg: TrainConfig, checkpoint_dir: str | None) -> None:
    """A :class:`ResumeConfigError` when the config the checkpoints were trained with (the output folder's
    ``train_config.json``, else the one beside ``checkpoint_dir``) cannot be read or differs from ``cfg`` in a field
    outside :data:`RESUMABLE_FIELDS`. Neither file: nothing to compare."""
    candidates = [os.path.join(cfg.output_dir, "train_config.json")]
    if checkpoint_dir is not None:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(checkpoint_dir)), "train_config.json"))
    previous_path = next((p for p in candidates if os.path.exists(p)), None)
    if previous_path is None:
        return
    try:
        with open(previous_path, encoding="utf-8") as f:
            previous = json.load(f)
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise ResumeConfigError(
            f"Cannot resume: {previous_path} (the config the checkpoints were trained with) is corrupt and "
            f"cannot be read ({err}). Restore it, or pass allow_config_change=True (--allow-config-change) "
            "to resume with the given config."
        ) from None
    changed = _changed_fields(previous, cfg)
    if changed:
        raise ResumeConfigError(
            f"Cannot resume with a changed config: the run's checkpoints were trained with {previous_path}, "
            f"which differs in {len(changed)} field(s):\n  " + "\n  ".join(changed) + "\n"
            "Resume with the same config, train into a new --output-dir, or pass allow_config_change=True "
            "(--allow-config-change) to resume with these changes anyway."
        )


def _refuse_or_overwrite_an_earlier_run(cfg: TrainConfig, overwrite_output_dir: bool) -> None:
    """A new run: an :class:`OutputDirError` when the output folder holds an earlier run (checkpoints, a final model
    or a summary), unless ``overwrite_output_dir``, which removes that run's outputs (:func:`_overwrite`)."""
    out = cfg.output_dir
    earlier = checkpoints(out) if os.path.isdir(out) else []
    earlier += [n for n in ("final", "train_summary.json") if os.path.exists(os.path.join(out, n))]
    if earlier and not overwrite_output_dir:
        raise OutputDirError(
            f"Output folder {out} already holds a training run ({', '.join(earlier)}). Pass resume=True "
            "(--resume) to continue it, overwrite_output_dir=True (--overwrite-output-dir) to replace it, or "
            "choose a new output_dir (--output-dir)."
        )
    if overwrite_output_dir and os.path.isdir(out):
        _overwrite(cfg, out)


def _run_output_names(out: str) -> list[str]:
    """The entries of ``out`` named like a run's outputs (:data:`_RUN_OUTPUTS`), whoever wrote them."""
    return sorted(
        {os.path.basename(p) for pattern in _RUN_OUTPUTS for p in glob.glob(os.path.join(glob.escape(out), pattern))}
    )


def _overwrite(cfg: TrainConfig, out: str) -> None:
    """Remove the earlier run's outputs from ``out``: what the manifest lists, nothing else (see
    :func:`prepare_output_dir`)."""
    found = _run_output_names(out)
    _refuse_to_remove_inputs(cfg, [os.path.join(out, name) for name in found])
    manifest = _read_manifest(out)
    if manifest is not None:
        ours = set(manifest["outputs"])
    elif _is_older_cde_st_run(out):
        logger.warning(
            "overwrite_output_dir: %s was written by an older cde_st (no %s); removing its run outputs %s",
            out,
            MANIFEST_FILE,
            found,
        )
        ours = set(found)
    else:
        ours = set()
    foreign = [name for name in found if name not in ours]
    if foreign:
        why = (
            f"{MANIFEST_FILE} does not list them"
            if manifest is not None
            else "the folder never held a cde_st run (no " + MANIFEST_FILE + ")"
        )
        raise OutputDirError(
            f"overwrite_output_dir (--overwrite-output-dir) would remove {', '.join(foreign)} in {out}, which were "
            f"not written by a cde_st run ({why}). Nothing was removed. Move them elsewhere (or delete them "
            "yourself), or choose a new output_dir (--output-dir)."
        )
    for name in found:
        path = os.path.join(out, name)
        logger.warning("overwrite_output_dir: removing %s", path)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(out, MANIFEST_FILE))
