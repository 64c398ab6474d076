"""``cde-st-serve --workers N``: processes sharing one port and one state directory, supervised (a worker that dies
is replaced while the others serve; workers that cannot start are not restarted forever)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sample_texts import TOPIC_DOCS
from serving_helpers import process_running

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _served_fingerprint(url: str, context: str) -> str | None:
    """The context fingerprint of one embedding answer on a new connection (None: no 200 answer)."""
    body = {"model": "tiny-cde", "input": ["a query"], "input_type": "query", "context": context}
    try:
        response = httpx.post(f"{url}/v1/embeddings", json=body, timeout=30)
    except httpx.TransportError:
        return None
    return response.json()["context"]["fingerprint"] if response.status_code == 200 else None


def _every_worker_serves(url: str, context: str, fingerprint: str, limit: float = 60) -> None:
    """Twelve answers in a row with ``fingerprint`` (connections go to either worker), within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while [_served_fingerprint(url, context) for _ in range(12)] != [fingerprint] * 12:
        assert time.monotonic() < deadline, f"{context!r} not served with {fingerprint} by every worker in {limit} s"
        time.sleep(0.1)


def test_workers_share_one_port_and_state_and_a_killed_one_is_replaced(cde_dir, start_server, tmp_path):
    server = start_server(cde_dir, "--served-model-name", "tiny-cde", "--state-dir", str(tmp_path / "state"),
                          "--context-refresh-s", "0.2", "--workers", "2")  # fmt: skip
    first = _children(server.proc.pid)
    assert len(first) == 2
    with httpx.Client(base_url=server.url, timeout=90) as client:
        made = client.post("/v1/contexts", json={"name": "pooled", "documents": TOPIC_DOCS, "seed": 0})
    assert made.status_code == 201, made.text
    fingerprint = made.json()["fingerprint"]
    _every_worker_serves(server.url, "pooled", fingerprint)  # a context made through one worker, served by both

    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while (now := _children(server.proc.pid)) & {victim} or len(now) < 2:
        assert server.proc.poll() is None, f"the parent ended with {server.proc.returncode}:\n{server.output()}"
        assert time.monotonic() < deadline, f"no worker replaced the killed one within 120 s:\n{server.output()}"
        time.sleep(0.1)
    assert now - first and now & first == first - {victim}  # one new process beside the one that kept serving
    # The new worker accepts connections once it serves, and it serves the stored context.
    _every_worker_serves(server.url, "pooled", fingerprint)
    # The victim may still have been loading (the first worker ready answers everything): replaced either way.
    assert re.search(rf"worker {victim} ended with status -9( before serving)?; starting another", server.output())
    assert server.stop() == 0  # SIGTERM reaches both workers; the parent exits 0 once they have
    assert all(not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
               for pid in now)  # fmt: skip


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


_ORPHAN = """
import importlib.util, signal, sys, time
spec = importlib.util.spec_from_file_location("workers", sys.argv[1])
workers = sys.modules["workers"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(workers)
def drain(signum, frame):
    open(sys.argv[2], "w").write("drained")
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
workers.stop_when_orphaned(interval=0.05)
print("watching", flush=True)
time.sleep(120)
"""
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "watching\\n"
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_worker_whose_parent_is_killed_with_sigkill_drains_and_exits(tmp_path):
    """What every --workers child runs (serve_command calls stop_when_orphaned for them): a parent killed with
    SIGKILL forwards nothing, so the child notices it is gone and stops itself through its SIGTERM path (drain)."""
    from cde_st.serving import workers

    marker = tmp_path / "drained"
    command = [sys.executable, "-c", _PARENT, _ORPHAN, workers.__file__, str(marker)]
    parent = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while process_running(child):
        assert time.monotonic() < deadline, "the worker still runs 30 s after its parent was killed"
        time.sleep(0.05)
    assert marker.read_text() == "drained"
