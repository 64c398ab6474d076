"""``python SCRIPT ARGS`` for the tests, without paying for ``import sentence_transformers`` each time.

That import takes about 9 s of one core on the 2-core CI machine, and the tests run dozens of Python processes
(scripts, the CLI, README blocks). :func:`run_python` runs one in a process forked from a multiprocessing
forkserver that has imported sentence-transformers (and with it torch and transformers) once per test worker:
a new process, its own environment, working directory, arguments and output files, exit status as Python gives
it, but the heavy modules already in ``sys.modules``. Nothing of the project is imported beforehand, so a script
still imports ``cde_st`` (and reads the variables it reads at import) afresh.

It is only for what a test reads back (exit status, stdout, stderr, files): tests that send signals, kill the
process or check what an import loads start a real interpreter with ``subprocess``. Where the environment a run
asks for differs from the forkserver's in a variable read at import time (``HF_*``, ``OMP_NUM_THREADS``,
``PYTHONPATH``, ...), or ``CDE_ST_TESTS_FRESH_PYTHON=1`` is set, the run falls back to ``subprocess`` with the
same arguments.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["PreloadedProcess", "run_python", "start_python"]

#: Variables read when torch, transformers, huggingface_hub or Python itself start: a run whose environment
#: differs from the forkserver's in one of these needs a fresh interpreter.
_IMPORT_TIME = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "PYTHON", "SENTENCE_TRANSFORMERS")
_PRELOAD = ["sentence_transformers"]
_context = None
_server_env: dict[str, str] = {}


def _import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME)}


def _forkserver():
    global _context, _server_env
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
        _server_env = _import_time(dict(os.environ))  # the forkserver starts with this process's environment
    return _context


def _context_for(args: list[str], env: dict[str, str]):
    """The forkserver's context for a run of ``args`` under ``env``, or None where it needs a fresh interpreter."""
    fresh = os.environ.get("CDE_ST_TESTS_FRESH_PYTHON") == "1" or not args
    fresh = fresh or (args[0].startswith("-") and args[0] not in ("-m", "-c"))
    context = None if fresh else _forkserver()
    return None if context is None or _import_time(env) != _server_env else context


def run_python(
    args: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """What ``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`` gives, ``args`` being a script path, ``-m MODULE`` or ``-c CODE`` and its arguments."""
    env = dict(os.environ if env is None else env)
    command = [sys.executable, *args]
    context = _context_for(args, env)
    if context is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="preloaded-python-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        out.touch()
        err.touch()  # read back even if the process ends before it writes (killed at the timeout)
        process = context.Process(target=_main, args=(list(args), str(cwd or os.getcwd()), env, str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout, out.read_bytes(), err.read_bytes())
        return subprocess.CompletedProcess(
            command, process.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


class PreloadedProcess:
    """The part of :class:`subprocess.Popen` the tests use (``pid``, ``poll``, ``wait``, ``send_signal``,
    ``terminate``, ``kill``, ``returncode``) for a process started by :func:`start_python`."""

    def __init__(self, process, args: list[str]) -> None:
        self._process, self.args, self.pid = process, args, process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_python(
    args: list[str],
    *,
    log: str | Path,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> PreloadedProcess | subprocess.Popen:
    """What ``subprocess.Popen([sys.executable, *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    cwd=cwd, env=env)`` starts, from the preloaded forkserver where it can (:func:`run_python`'s rules); with
    ``fresh``, always a fresh interpreter (a run whose own main module matters, e.g. to processes it spawns)."""
    env = dict(os.environ if env is None else env)
    command = [sys.executable, *args]
    context = None if fresh else _context_for(args, env)
    if context is None:
        with open(log, "wb") as out:
            return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    Path(log).write_bytes(b"")
    process = context.Process(target=_main, args=(list(args), str(cwd or os.getcwd()), env, str(log), str(log)))
    process.start()
    return PreloadedProcess(process, command)


def _main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: become ``python *args`` and exit as it would."""
    import runpy
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    opened: dict[str, int] = {}  # stdout and stderr to one file share one offset, as with stderr=STDOUT
    for fd, path in ((1, out), (2, err)):
        if path not in opened:
            opened[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(opened[path], fd)
    for target in opened.values():
        os.close(target)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, kept for its life
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    status = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path.insert(0, "")
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            script = os.path.abspath(args[0])
            sys.argv = [args[0], *args[1:]]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None:
            status = 0
        elif isinstance(exit_.code, int):
            status = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    import atexit

    atexit._run_exitfuncs()  # what an interpreter runs at exit, before os._exit skips it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
