"""What every benchmark repeats, in one place: timing with warm-up, the machine it ran on, the results JSON and the
Markdown tables.

A driver under ``benchmarks/speed/``, ``benchmarks/quality/`` or ``benchmarks/serving/`` runs as a script (its own
folder first on ``sys.path``), so it reaches this module through its parent folder::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
    from harness import environment, timed_calls, write_json

Nothing here imports torch at import time: a driver that only starts worker processes stays light.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "RESULT",
    "Stopwatch",
    "command_line",
    "emit_result",
    "environment",
    "format_value",
    "free_memory",
    "load_average",
    "load_averages",
    "log",
    "markdown_table",
    "parse_result",
    "sync",
    "timed_call",
    "timed_calls",
    "warm_up",
    "write_json",
]

REPO = Path(__file__).resolve().parents[1]
RESULT = "RESULT "  # the prefix of a worker process's result lines on stdout; anything else there is its log
PACKAGES = ("transformers", "sentence-transformers", "datasets", "faiss-cpu", "faiss-gpu-cu12", "flash-attn", "numpy")


def log(message: str) -> None:
    """Print ``message`` with the wall-clock time, flushed (a run's log is read while it runs)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_averages() -> list[float] | None:
    """The 1/5/15-minute load average as numbers for a results file (``[1.2, 0.9, 0.7]``); None where the system
    has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def load_average() -> str:
    """The 1/5/15-minute load average (``"1.20 / 0.90 / 0.70"``): every timing says how busy the machine was."""
    loads = load_averages()
    return "n/a" if loads is None else " / ".join(f"{x:.2f}" for x in loads)


def sync(device: Any) -> None:
    """Wait for ``device`` (a CUDA device's queued kernels); a no-op elsewhere."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def free_memory() -> None:
    """Return what the last measurement left behind (Python garbage, the CUDA allocator's cache)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def warm_up(fn: Callable[[], Any], times: int = 1, *, device: Any = "cpu") -> None:
    """Call ``fn`` ``times`` times untimed (kernel choice, allocator, caches), then wait for ``device``."""
    for _ in range(times):
        fn()
    if times:
        sync(device)


def timed_calls(fn: Callable[[], Any], repeats: int = 1, *, device: Any = "cpu") -> tuple[list[float], Any]:
    """Wall seconds of each of ``repeats`` calls of ``fn`` (the device waited for after each, so that queued work is
    counted where it was asked for), and the last call's return value."""
    seconds, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds, value


def timed_call(fn: Callable[[], Any], *, device: Any = "cpu") -> tuple[float, Any]:
    """Wall seconds of one call of ``fn`` (the device waited for) and its return value."""
    seconds, value = timed_calls(fn, 1, device=device)
    return seconds[0], value


class Stopwatch:
    """Wall seconds (``time.perf_counter``) for what a call cannot wrap: one awaited request among many, a loop that
    runs until a deadline. Running from its creation; ``with Stopwatch() as watch:`` restarts it on entry and stops
    it on exit, so that ``watch.seconds`` is the block's time::

        with Stopwatch() as watch:
            response = await client.post(url, json=body)
        latencies.append(watch.seconds)
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.stopped: float | None = None

    def __enter__(self) -> Stopwatch:
        self.started, self.stopped = time.perf_counter(), None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Seconds from the start to the stop, or to now while it runs."""
        return (time.perf_counter() if self.stopped is None else self.stopped) - self.started


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def environment(device: Any = "cpu", packages: Iterable[str] = PACKAGES) -> dict:
    """The machine and software a measurement ran on: Python, torch (and its CUDA), the device's name, CPU cores,
    torch threads, the float32 matmul precision, the GPU's memory, the versions of ``packages`` and the load."""
    import torch

    cuda = torch.device(device).type == "cuda"
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
        "device": torch.cuda.get_device_name() if cuda else _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    if cuda:
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    env.update({name: _version(name) for name in packages})
    env["load_average"] = load_average()
    return env


def command_line(argv: Sequence[str] | None = None, prefix: str = "python") -> str:
    """The command that ran this script, as typed from the repository root (for the results file)."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    try:
        shown = script.relative_to(REPO)
    except ValueError:  # a copy of the script elsewhere: its full path
        shown = script
    return " ".join([prefix, shlex.quote(str(shown)), *map(shlex.quote, argv[1:])])


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON (folders made; numbers torch or numpy hold become floats, the rest strings)."""

    def fallback(value: Any) -> Any:
        try:
            return float(value)
        except (TypeError, ValueError):
            return str(value)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=fallback), encoding="utf-8")
    return path


def emit_result(message: dict) -> None:
    """A worker process's result line: the driver reads it from the worker's stdout with :func:`parse_result`."""
    print(RESULT + json.dumps(message, default=float), flush=True)


def parse_result(line: str) -> dict | None:
    """The message of a :func:`emit_result` line; None for any other line (the worker's log)."""
    return json.loads(line[len(RESULT) :]) if line.startswith(RESULT) else None


def format_value(value: Any) -> str:
    """A table cell: three significant digits for floats (scientific where tiny or huge), ``k xN`` for counts."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e5 else f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in value.items())
    return str(value)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """The lines of a Markdown table: ``columns`` as the header, each row's cells through :func:`format_value`.
    ``align``: one character per column, ``l`` or ``r`` (default: all left)."""
    align = align or "l" * len(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    lines += ["| " + " | ".join(format_value(cell) for cell in row) + " |" for row in rows]
    return lines
