"""``cde-st-serve --workers N``: N server processes on one port of one host, sharing one state directory.

The parent binds the listening socket and starts N children (``python -m cde_st.serving`` with the same arguments
and ``--listen-fd``), each a full server (its own model, batcher and context store) accepting connections from the
shared socket; the kernel hands each connection to one of them. They are replicas of one state directory
(:mod:`cde_st.serving.contexts`): a context written through one is served by all within ``--context-refresh-s``.
The parent forwards SIGTERM and SIGINT to the children, waits for them, and exits with the first failure's status
(0 when all end well).

A child that ends on its own after it started serving (killed, out of memory) is replaced by a new one, as gunicorn
does with its workers, while the others keep serving. Each child says when it serves through a pipe (``--ready-fd``),
so that children failing before that (a model that does not load) are told apart whatever the machine's speed: after
``start_failures`` of them in a row the parent stops the others and exits with the last one's status. A parent
killed with SIGKILL cannot forward anything: each child watches its parent (:func:`stop_when_orphaned`) and drains
and exits when it is gone, rather than serving on unsupervised.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

__all__ = ["run_workers", "stop_when_orphaned"]


@dataclass
class _Worker:
    process: subprocess.Popen
    ready_pipe: int  # read end: one byte once the child serves, end of file when it ends
    served: bool = False

    def check_served(self) -> bool:
        if not self.served:
            try:
                self.served = os.read(self.ready_pipe, 1) == b"1"
            except BlockingIOError:  # not yet
                pass
        return self.served


def _start(command: list[str], listen_fd: int) -> _Worker:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    process = subprocess.Popen([*command, "--ready-fd", str(write_end)], pass_fds=(listen_fd, write_end))
    os.close(write_end)
    return _Worker(process, read_end)


def run_workers(argv: list[str], workers: int, sock: socket.socket, *, start_failures: int = 3) -> int:
    """Run ``workers`` children serving ``sock`` with the command-line arguments ``argv``, replacing a child that
    ends on its own, until SIGTERM/SIGINT or ``start_failures`` children in a row end before serving; the exit
    status (0, or the failure's; a signal ``s`` as ``128 + s``, as a shell gives it)."""
    fd = sock.fileno()
    command = [sys.executable, "-m", "cde_st.serving", *argv, "--workers", "1", "--listen-fd", str(fd)]
    pool = [_start(command, fd) for _ in range(workers)]
    signalled: set[int] = set()  # pids sent the stop signal: a second SIGTERM would cut a worker's drain short
    stopping, failure, in_a_row = False, None, 0

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        for worker in pool:
            if worker.process.poll() is None and worker.process.pid not in signalled:
                signalled.add(worker.process.pid)
                worker.process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    while not stopping:
        time.sleep(0.2)
        for i, worker in enumerate(pool):
            served = worker.check_served()
            code = worker.process.poll()
            if code is None or stopping:
                continue
            in_a_row = 0 if served else in_a_row + 1
            if in_a_row >= start_failures:
                print(
                    f"cde-st-serve: {in_a_row} workers in a row ended before serving (the last, "
                    f"{worker.process.pid}, with status {code}); stopping. Their errors are above.",
                    file=sys.stderr,
                    flush=True,
                )
                failure = code or 1
                stop(signal.SIGTERM, None)
                break
            when = "" if served else " before serving"
            print(f"cde-st-serve: worker {worker.process.pid} ended with status {code}{when}; starting another.",
                  file=sys.stderr, flush=True)  # fmt: skip
            os.close(worker.ready_pipe)  # here, not before the stop above: the end closes the pipes of the pool
            pool[i] = _start(command, fd)
    stop(signal.SIGTERM, None)  # a worker started as the signal came in has not had it yet
    codes = [worker.process.wait() for worker in pool]
    for worker in pool:
        os.close(worker.ready_pipe)
    if failure is None:
        failure = next((code for code in codes if code not in (0, -signal.SIGTERM, -signal.SIGINT)), 0)
    return 128 - failure if failure < 0 else failure


def stop_when_orphaned(interval: float = 1.0) -> threading.Thread:
    """In a ``--workers`` child: send this process SIGTERM (drain, then exit) once its parent is gone (the process
    is then re-parented, so ``os.getppid()`` changes). Checked every ``interval`` seconds in a daemon thread."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="cde-st-serve-parent-watch", daemon=True)
    thread.start()
    return thread
