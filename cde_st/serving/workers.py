"""``cde-st-serve --workers N``: N server processes on one port of one host, sharing one state directory.

The parent binds the listening socket and starts N children (``python -m cde_st.serving`` with the same arguments
and ``--listen-fd``), each a full server (its own model, batcher and context store) accepting connections from the
shared socket; the kernel hands each connection to one of them. They are replicas of one state directory
(:mod:`cde_st.serving.contexts`): a context written through one is served by all within ``--context-refresh-s``.
The parent forwards SIGTERM and SIGINT to the children, waits for them, and exits with the first non-zero status
(0 when all end well); if one child ends on its own, the others are stopped.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

__all__ = ["run_workers"]


def run_workers(argv: list[str], workers: int, sock: socket.socket) -> int:
    """Run ``workers`` children serving ``sock`` with the command-line arguments ``argv``; their exit status."""
    fd = sock.fileno()
    command = [sys.executable, "-m", "cde_st.serving", *argv, "--workers", "1", "--listen-fd", str(fd)]
    children = [subprocess.Popen(command, pass_fds=(fd,)) for _ in range(workers)]
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    while all(child.poll() is None for child in children):
        time.sleep(0.2)
    if not stopping:  # a child ended on its own: the others stop too, so a supervisor sees the failure
        stop(signal.SIGTERM, None)
    codes = [child.wait() for child in children]
    return next((code for code in codes if code not in (0, -signal.SIGTERM, -signal.SIGINT)), 0)
