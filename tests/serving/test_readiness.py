"""Readiness with a stand-in engine: not ready until a warm-up forward is answered, the forward cost measured once
(or taken from the settings), a model that fails its warm-up marked broken for good, a model process that ended
reported and warmed up again by the watch, which waits longer after each failed start."""

from __future__ import annotations

import asyncio

import pytest

from cde_st.serving import readiness
from cde_st.serving.model_process import ModelProcessFailed
from cde_st.serving.readiness import WATCH_SECONDS, Readiness


class Process:
    """A model process: ``running`` and ``ready`` as set."""

    def __init__(self) -> None:
        self.running = self.ready = False


class Engine:
    """What :class:`Readiness` uses of an engine; ``faults``: what each forward raises in turn (None: answered)."""

    tokenizer_executor = executor = None  # the loop's default executor

    def __init__(self, process: Process | None = None, faults=()) -> None:
        self.model_process, self.faults = process, list(faults)
        self.forward_overhead_tokens, self.calls = None, []

    def tokenize(self, texts, input_type):
        return ("tokens", tuple(texts))

    def embed_tokens(self, parts, context):
        self.calls.append(("forward", parts, context))
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            raise fault
        if self.model_process is not None:
            self.model_process.running = self.model_process.ready = True

    def forward_probes(self):
        self.calls.append(("probes",))
        return "probes"

    def measure_forward_overhead(self, probes, context):
        self.calls.append(("measure", probes, context))
        return 48.0


def _readiness(engine: Engine, overhead="auto") -> tuple[Readiness, list]:
    observed = []
    return Readiness(engine, overhead, observed.append, lambda: "the context"), observed


def test_ready_once_a_warm_up_is_answered_and_the_cost_measured_once():
    engine = Engine()
    ready, observed = _readiness(engine)
    assert ready.problem() == "The model is still loading."
    assert asyncio.run(ready.warm_up()) is True and ready.problem() is None
    assert engine.calls == [
        ("forward", [("tokens", ("warm up",))], "the context"),
        ("probes",),
        ("measure", "probes", "the context"),
    ]
    assert observed == [48.0]
    assert asyncio.run(ready.warm_up()) is True and [c[0] for c in engine.calls[3:]] == ["forward"]  # not again


@pytest.mark.parametrize(("overhead", "observed"), [(64.0, 64.0), (None, 0)])
def test_a_cost_from_the_settings_is_set_not_measured(overhead, observed):
    engine = Engine()
    engine.forward_overhead_tokens = 1.0
    ready, seen = _readiness(engine, overhead)
    assert asyncio.run(ready.warm_up()) is True
    assert engine.forward_overhead_tokens == overhead and seen == [observed]
    assert [c[0] for c in engine.calls] == ["forward"]


def test_a_model_failing_its_warm_up_is_broken_for_good_and_an_ended_process_is_retried():
    broken, _ = _readiness(Engine(faults=[FloatingPointError("NaN")]))
    assert asyncio.run(broken.warm_up()) is False and broken.broken
    assert broken.problem() == "The model failed its warm-up forward (see the server log)."
    process = Process()
    retried, observed = _readiness(Engine(process, faults=[ModelProcessFailed("killed")]))
    assert asyncio.run(retried.warm_up()) is False and not retried.broken and observed == []
    assert retried.problem() == "The model is still loading."
    assert asyncio.run(retried.warm_up()) is True and retried.problem() is None and observed == [48.0]
    process.ready = False  # the child ended after answering
    assert retried.problem() == "The model's process ended and a new one is starting."


def test_without_a_model_process_the_watch_returns_at_once():
    ready, _ = _readiness(Engine())
    asyncio.run(asyncio.wait_for(ready.watch(), timeout=5))
    assert not ready.warmed  # the watch warmed nothing up


def test_the_watch_warms_up_a_new_process_waiting_longer_after_each_failed_start(monkeypatch):
    process = Process()
    failed = ModelProcessFailed("could not start")
    engine = Engine(process, faults=[failed, failed, failed])
    ready, _ = _readiness(engine)
    waits = []

    class Stop(Exception):
        pass

    async def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 7:
            raise Stop

    monkeypatch.setattr(readiness.asyncio, "sleep", sleep)
    with pytest.raises(Stop):
        asyncio.run(ready.watch())
    w = WATCH_SECONDS
    assert waits == [w, 2 * w, 4 * w, 8 * w, w, w, w]  # three failed starts, then warm and running: looked at only
    assert ready.warmed and [c[0] for c in engine.calls].count("forward") == 4
    process.running = False  # ended again: the next look warms up a new one
    waits.clear()
    with pytest.raises(Stop):
        asyncio.run(ready.watch())
    assert [c[0] for c in engine.calls].count("forward") == 5 and ready.warmed
