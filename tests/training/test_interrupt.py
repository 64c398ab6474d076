"""cde_st.training.interrupt: SIGINT and SIGTERM stop a real ``cde-st-train`` process at a step boundary with a
checkpoint, the command to resume and the folder's lock released; the resume command is the run's own."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cde_st.training import LOCK_FILE, TrainingInterrupted, resume_command

REPO = Path(__file__).resolve().parents[2]
# A run that would not end by itself within the test: it stops only if the signal stops it.
ENDLESS = ["--preset", "tiny", "--set", "max_steps=100000", "save_steps=100000"]


class _Run:
    """A ``cde-st-train`` subprocess whose merged output is collected by a thread (tqdm writes ``\\r``, not lines)."""

    def __init__(self, argv: list[str]) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        env.pop("CDE_ST_DEBUG", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cde_st.cli", "train", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while chunk := self.process.stdout.read1(65536):
            self.chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait_for(self, condition, what: str, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"the run ended (status {self.process.returncode}) before {what}:\n{self.output[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout} s:\n{self.output[-3000:]}")
            time.sleep(0.1)

    def finish(self, timeout: float = 120.0) -> int:
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not stop within {timeout} s of the signal:\n{self.output[-3000:]}")
        self.reader.join(timeout=10)
        return status

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_signal_after_the_first_step_stops_with_a_checkpoint_and_the_command_to_resume(
    tmp_path, signum, status, name
):
    out = tmp_path / "run"
    argv = [*ENDLESS, "--output-dir", str(out)]
    run = _Run(argv)
    try:
        run.wait_for(lambda: "'loss'" in run.output, "first logged step")
        run.process.send_signal(signum)
        assert run.finish() == status, run.output[-3000:]
    finally:
        run.kill()
    text = run.output
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    saved = sorted(out.glob("checkpoint-*"))
    assert len(saved) == 1, text[-3000:]  # save_steps is far away: the signal's own checkpoint
    step = int(saved[0].name.split("-")[1])
    assert f"stopped by {name}" in text and f"after step {step}: saved {saved[0]}" in text, text[-3000:]
    assert not (out / LOCK_FILE).exists() and not (out / "final").exists()
    command = shlex.join(["cde-st-train", *argv, "--resume"])
    assert command in text, text[-3000:]
    if signum == signal.SIGINT:  # the printed command resumes the run (asked to end two steps later)
        from cde_st.cli import train_run

        resumed = shlex.split(command)[1:]
        resumed[resumed.index("max_steps=100000")] = f"max_steps={step + 2}"
        assert train_run(resumed) == 0
        assert json.loads((out / "train_summary.json").read_text())["steps"] == step + 2


@pytest.mark.slow
def test_sigterm_while_the_run_is_loading_stops_at_once_and_releases_the_lock(tmp_path):
    """Before the first step there is nothing to save: the run stops at once, but still lets go of its folder (the
    default SIGTERM left the lock for the next run to take over)."""
    out = tmp_path / "run"
    run = _Run([*ENDLESS, "--output-dir", str(out)])
    try:
        run.wait_for(lambda: (out / LOCK_FILE).exists(), "lock file")
        run.process.send_signal(signal.SIGTERM)
        assert run.finish() == 143, run.output[-3000:]
    finally:
        run.kill()
    assert "Traceback" not in run.output, run.output[-3000:]
    assert "stopped" in run.output and "SIGTERM" in run.output, run.output[-3000:]
    assert not (out / LOCK_FILE).exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--preset", "tiny", "--output-dir", "runs/a b"],
            "cde-st-train --preset tiny --output-dir 'runs/a b' --resume",
        ),
        (["--config", "c.yaml", "--overwrite-output-dir"], "cde-st-train --config c.yaml --resume"),
        (["--resume", "runs/a/checkpoint-2", "--set", "seed=1"], "cde-st-train --set seed=1 --resume"),
        (["--resume=runs/a/checkpoint-2", "--debug"], "cde-st-train --debug --resume"),
        (["--resume", "--debug"], "cde-st-train --debug --resume"),
    ],
)
def test_the_resume_command_is_the_runs_own_with_resume(argv, expected):
    assert resume_command(argv) == expected
    assert resume_command(argv, "python train/train_cde.py").startswith("python train/train_cde.py ")


def test_the_interruption_says_what_was_saved_and_its_exit_status():
    saved = TrainingInterrupted(signal.SIGTERM, step=3, checkpoint="runs/a/checkpoint-3")
    assert saved.exit_status == 143 and isinstance(saved, KeyboardInterrupt)
    assert "after step 3: saved runs/a/checkpoint-3. To resume:\n  CMD" in saved.describe("CMD")
    earlier = TrainingInterrupted(signal.SIGINT, checkpoint="runs/a/checkpoint-2")
    assert earlier.exit_status == 130 and "newest checkpoint (runs/a/checkpoint-2)" in earlier.describe("CMD")
    assert "before any checkpoint was saved" in TrainingInterrupted(signal.SIGINT).describe("CMD")


def test_a_checkpoint_cut_short_by_a_second_signal_is_passed_over_and_the_complete_one_named(tmp_path):
    import torch

    complete = tmp_path / "checkpoint-3"
    complete.mkdir()
    (complete / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.save({}, complete / name)
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text("{")  # the save stopped half way
    stop = TrainingInterrupted(signal.SIGINT)
    stop.locate_checkpoint(str(tmp_path))
    assert stop.checkpoint == stop.resume_from == str(complete)
    command = resume_command(["--preset", "tiny"], checkpoint=stop.resume_from)
    assert command == f"cde-st-train --preset tiny --resume {complete}"
    assert f"newest checkpoint ({complete})" in stop.describe(command)
    newest = TrainingInterrupted(signal.SIGTERM, step=3)
    newest.locate_checkpoint(str(tmp_path / "only"))
    assert newest.checkpoint is None
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.save({}, tmp_path / "checkpoint-6" / name)
    newest.locate_checkpoint(str(tmp_path))
    assert newest.checkpoint == str(tmp_path / "checkpoint-6") and newest.resume_from is None


def test_ctrl_c_before_the_run_began_is_one_line_and_status_130(monkeypatch, capsys):
    from cde_st import training
    from cde_st.cli import train_run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    assert train_run(["--preset", "tiny"]) == 130
    err = capsys.readouterr().err
    assert (
        "Traceback" not in err
        and err.strip() == "cde-st-train: interrupted before training began; nothing was written."
    )
