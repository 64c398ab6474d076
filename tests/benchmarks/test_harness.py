"""The benchmarks' shared harness (benchmarks/harness.py): timing, load average, results lines and files, tables.
Loaded from its path, as a driver reaches it."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "harness.py"
spec = importlib.util.spec_from_file_location("harness", HARNESS)
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


class FakeClock:
    """``time.perf_counter`` advanced by hand, so timings are exact and nothing sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def test_a_stopwatch_runs_from_its_creation_and_a_block_freezes_it(clock):
    watch = harness.Stopwatch()
    clock.now += 2.5
    assert watch.seconds == 2.5  # still running
    clock.now += 1.0
    assert watch.seconds == 3.5
    with harness.Stopwatch() as block:  # restarted on entry
        clock.now += 0.25
    clock.now += 10.0
    assert block.seconds == 0.25  # stopped on exit
    with block:  # reused: a fresh time
        clock.now += 4.0
    assert block.seconds == 4.0


def test_timed_call_returns_one_calls_seconds_and_its_value(clock):
    calls = []

    def work():
        calls.append(1)
        clock.now += 0.75
        return "done"

    assert harness.timed_call(work) == (0.75, "done")
    seconds, value = harness.timed_calls(work, 3)
    assert (seconds, value, len(calls)) == ([0.75, 0.75, 0.75], "done", 4)


def test_load_average_as_numbers_and_as_text(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 0.9, 0.7049))
    assert harness.load_averages() == [1.23, 0.9, 0.7]
    assert harness.load_average() == "1.23 / 0.90 / 0.70"

    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert harness.load_averages() is None
    assert harness.load_average() == "n/a"


def test_results_lines_files_and_tables(tmp_path, capsys):
    harness.emit_result({"rate": 1.5, "rows": 3})
    line = capsys.readouterr().out.strip()
    assert harness.parse_result(line) == {"rate": 1.5, "rows": 3}
    assert harness.parse_result("a log line") is None
    path = harness.write_json(tmp_path / "deep" / "r.json", {"x": 1, "path": tmp_path})
    assert json.loads(path.read_text()) == {"x": 1, "path": str(tmp_path)}
    assert harness.markdown_table(["a", "b"], [[1.23456, {"x": 2}]], align="lr") == [
        "| a | b |",
        "|---|---:|",
        "| 1.235 | x x2 |",
    ]
    assert harness.command_line([str(HARNESS), "--out", "a b"]) == "python benchmarks/harness.py --out 'a b'"
