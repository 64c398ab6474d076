"""``cde-st-serve --workers N`` supervises its processes: a worker that dies is replaced while the others serve, and
workers that cannot start are not restarted forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _embed(url: str) -> int | str:
    """The status of one embedding request on a new connection, or the transport error's name."""
    try:
        response = httpx.post(
            f"{url}/v1/embeddings", json={"model": "tiny-cde", "input": ["a query"], "input_type": "query"}, timeout=30
        )
    except httpx.TransportError as exc:
        return type(exc).__name__
    return response.status_code


def test_a_killed_worker_is_replaced_while_the_other_serves(cde_dir, start_server, tmp_path):
    server = start_server(
        cde_dir, "--served-model-name", "tiny-cde", "--state-dir", str(tmp_path / "state"), "--workers", "2"
    )
    first = _children(server.proc.pid)
    assert len(first) == 2
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while (now := _children(server.proc.pid)) & {victim} or len(now) < 2:
        assert server.proc.poll() is None, f"the parent ended with {server.proc.returncode}:\n{server.output()}"
        assert time.monotonic() < deadline, f"no worker replaced the killed one within 120 s:\n{server.output()}"
        time.sleep(0.1)
    assert now - first and now & first == first - {victim}  # one new process beside the one that kept serving
    # Requests reach both processes (the kernel spreads connections over them); a new worker accepts once ready.
    assert [_embed(server.url) for _ in range(12)] == [200] * 12
    assert f"worker {victim} ended with status -9; starting another" in server.output()
    assert server.stop() == 0


def test_workers_that_cannot_start_end_the_command_with_their_status(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "modules.json").write_text("{ not json")
    command = [sys.executable, "-m", "cde_st.serving", str(broken), "--port", "0", "--workers", "2"]
    command += ["--state-dir", str(tmp_path / "state")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode not in (0, None), done.stderr
    assert "3 workers in a row ended before serving" in done.stderr
    assert done.stderr.count("before serving; starting another") == 2  # three failures end it, not a restart loop
