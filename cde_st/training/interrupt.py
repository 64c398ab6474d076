"""Stopping a run on Ctrl-C (SIGINT) or SIGTERM at a step boundary, with a checkpoint to resume from.

While :func:`~cde_st.training.run.train` runs, :class:`StopOnSignal` holds both signals. In the training loop the
first one lets the current optimizer step finish, saves a checkpoint of that step (``checkpoint-N``, as the trainer
saves every ``save_steps``) and stops; :func:`train` then raises :class:`TrainingInterrupted`, whose message says
where the checkpoint is and how to resume. Before the first step (loading the model, clustering the pairs), after
the last one, or on a second signal, the run stops at once: there is no finished step to save, or the user asked
twice. Either way the exception passes through the output folder's lock, which is released.

A scheduler's SIGTERM (Slurm, Kubernetes) thus leaves a resumable run rather than a dead lock. The command line
exits with the shell's convention for a death by signal: 130 after SIGINT, 143 after SIGTERM.

    cde-st-train --preset tiny --output-dir runs/t      # Ctrl-C during training:
    # cde-st-train: stopped by SIGINT (Ctrl-C) after step 3: saved runs/t/checkpoint-3. To resume:
    #   cde-st-train --preset tiny --output-dir runs/t --resume
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
from types import FrameType

import torch
from transformers import TrainerCallback

from cde_st.training.checkpoints import CheckpointError, check_checkpoint, checkpoints

logger = logging.getLogger(__name__)

__all__ = ["StopOnSignal", "TrainingInterrupted", "program_name", "resume_command"]

# The signals a run stops on, with the words its messages use for them.
_SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM. ``step``: the step whose checkpoint was saved on the way out (None: the
    run stopped at once and saved nothing); ``checkpoint``: the newest checkpoint in the output folder that can be
    resumed from (None: there is none); ``resume_from``: that checkpoint where a plain resume would take a newer,
    incomplete one (a second signal cut its saving short), else None; ``exit_status``: 128 + the signal number
    (130 for SIGINT, 143 for SIGTERM), the shell's convention.

    A :class:`KeyboardInterrupt`, as an uncaught Ctrl-C is: ``except Exception`` in code it passes through does
    not swallow it."""

    def __init__(self, signum: int, step: int | None = None, checkpoint: str | None = None) -> None:
        super().__init__(signum)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.resume_from: str | None = None

    def __str__(self) -> str:
        return self.describe("train(cfg, resume=True), or the same cde-st-train command with --resume")

    @property
    def exit_status(self) -> int:
        """The exit status of a command stopped by this signal: 128 + its number."""
        return 128 + int(self.signum)

    def locate_checkpoint(self, output_dir: str) -> None:
        """Set ``checkpoint`` (and ``resume_from``) from the checkpoints in ``output_dir``."""
        found = checkpoints(output_dir) if os.path.isdir(output_dir) else []
        for name in reversed(found):
            try:
                check_checkpoint(os.path.join(output_dir, name))
            except (CheckpointError, OSError):
                continue
            self.checkpoint = os.path.join(output_dir, name)
            self.resume_from = None if name == found[-1] else self.checkpoint
            return

    def describe(self, resume: str) -> str:
        """What happened and what to run next; ``resume``: the command (or call) that resumes the run."""
        name = _SIGNALS.get(self.signum, f"signal {self.signum}")
        if self.step is not None:
            return f"stopped by {name} after step {self.step}: saved {self.checkpoint}. To resume:\n  {resume}"
        if self.checkpoint is not None:
            return (
                f"stopped at once by {name}; the steps after the newest checkpoint ({self.checkpoint}) are lost. "
                f"To resume from it:\n  {resume}"
            )
        return f"stopped at once by {name}, before any checkpoint was saved. Start the run again to train."


class StopOnSignal(TrainerCallback):
    """Holds SIGINT and SIGTERM while it is entered (``with StopOnSignal() as stop:``) and, as a trainer callback,
    stops training at the end of the step a signal came in, with a checkpoint of that step (see the module
    docstring). ``signum``: the signal that asked to stop (None: none came); ``stopped``: whether training stopped
    for it (on every process of a data-parallel run, which stop at the same step).

    Handlers can only be set in the main thread; in another thread nothing is held and signals act as usual."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopped = False
        self._in_loop = False
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked data loader worker (Ctrl-C reaches the whole process group): the trainer decides
        if not self._in_loop or self.signum is not None:
            raise TrainingInterrupted(signum)
        self.signum = signum
        # os.write, not print: a handler may run while the main code is inside a write to sys.stderr (tqdm), and
        # a buffered stream refuses a reentrant write.
        message = f"\n{_SIGNALS[signum]}: stopping after this step with a checkpoint to resume from (send it again to "
        os.write(2, (message + "stop at once, without saving).\n").encode())

    def on_train_begin(self, args, state, control, **kwargs):
        self._in_loop = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop_wanted(args) and state.global_step < state.max_steps:
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self._in_loop = False

    def _stop_wanted(self, args) -> bool:
        """Whether any process got a signal: data-parallel processes must stop at the same step, or the others wait
        for the stopped one in their next collective."""
        wanted = self.signum is not None
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(wanted)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            wanted = bool(flag.item())
        return wanted


def resume_command(argv: list[str] | None = None, program: str | None = None, checkpoint: str | None = None) -> str:
    """The command line that resumes the run ``program argv`` started (default: this process's command line and
    :func:`program_name`): the same options without ``--overwrite-output-dir`` (resuming keeps what the run
    wrote) and with ``--resume`` (the newest checkpoint, or ``checkpoint``) in place of any ``--resume [...]``."""
    if argv is None:
        argv, program = sys.argv[1:], program or program_name()
    kept, skip_value = [], False
    for word in argv:
        if skip_value:
            skip_value = False
            if not word.startswith("-"):
                continue  # the CHECKPOINT of `--resume CHECKPOINT`
        if word == "--overwrite-output-dir" or word.startswith("--resume="):
            continue
        if word == "--resume":
            skip_value = True
            continue
        kept.append(word)
    resume = ["--resume"] if checkpoint is None else ["--resume", checkpoint]
    return shlex.join([*shlex.split(program or "cde-st-train"), *kept, *resume])


def program_name() -> str:
    """How this process was started, for a command to repeat: ``python SCRIPT.py`` for a script, else the console
    script's name (``cde-st-train``)."""
    script = sys.argv[0] if sys.argv else ""
    if script.endswith(".py") and os.path.basename(script) != "cli.py":
        return shlex.join(["python", script])
    return "cde-st-train"
