"""The serving tests' constants and a real ``cde-st-serve`` process (:class:`Server`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
from preloaded_python import start_python

API_KEY = "test-key-not-a-secret"
API_KEY_ENV = "CDE_ST_TEST_API_KEY"
CONTEXT_SIZE = 8
MAX_SEQ_LENGTH = 32
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


class Server:
    """One ``python -m cde_st.serving`` process (what the ``cde-st-serve`` script runs), its output in a log file."""

    def __init__(
        self, model: str, log: Path, *args: str, env: dict | None = None, fresh: bool = False, started=None
    ) -> None:
        self.log = log
        full_env = dict(os.environ)
        full_env.update(
            HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **{API_KEY_ENV: API_KEY}
        )
        full_env.update(env or {})
        command = ["-m", "cde_st.serving", model, "--port", "0", "--log-level", "warning", *args]
        # a real process, from the forkserver with sentence-transformers preloaded unless ``fresh``
        self.proc = start_python(command, log=log, env=full_env, fresh=fresh)
        if started is not None:  # a test acts on the process while it loads: started(proc)
            started(self.proc)
        self.url = self._wait_ready(timeout=120)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        url = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            if url is None and (found := LISTENING.search(self.output())):
                url = found.group(1)
            if url is not None:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"the server was not ready within {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def client(self, key: str | None = API_KEY, timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has ended)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def wait_until_ended(pid: int, seconds: float = 10) -> bool:
    """Wait at most ``seconds`` for process ``pid`` to end; whether it did."""
    deadline = time.monotonic() + seconds
    while process_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_running(pid)
