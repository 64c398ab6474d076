"""The dynamic batcher in-process, with a recording fake forward: coalescing, bounds, keys, overload, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cde_st.serving.batching import DynamicBatcher, Overloaded, Unavailable


class Rows:
    def __init__(self, values):
        self.values = values

    def rows(self, start, stop):
        return self.values[start:stop]


class FakeForward:
    """Records each batch (key, texts); answers each text with (key, text); can be held on a gate."""

    def __init__(self) -> None:
        self.batches: list[tuple] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a forward starts (before the gate)
        self.fail: Exception | None = None

    def __call__(self, key, payloads):
        texts = [t for payload in payloads for t in payload]
        self.entered.set()
        self.gate.wait(timeout=10)
        self.batches.append((key, list(texts)))
        if self.fail is not None:
            raise self.fail
        return Rows([(key, t) for t in texts])


async def until_a_forward_runs(forward: FakeForward) -> None:
    deadline = time.monotonic() + 10
    while not forward.entered.is_set():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    forward.entered.clear()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def make(forward, **kwargs) -> DynamicBatcher:
    return DynamicBatcher(forward, ThreadPoolExecutor(max_workers=1), **kwargs)


def test_requests_queued_during_a_forward_share_the_next_one():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=32, max_wait=0)
        batcher.start()
        forward.gate.clear()
        first = asyncio.create_task(batcher.submit("k", ["first"]))
        await until_a_forward_runs(forward)  # the first forward is running (held); the next ten queue meanwhile
        rest = [asyncio.create_task(batcher.submit("k", [f"t{i}"])) for i in range(10)]
        await asyncio.sleep(0.05)
        forward.gate.set()
        answers = await asyncio.gather(first, *rest)
        await batcher.stop()
        return answers

    answers = run(go())
    assert answers == [[("k", "first")]] + [[("k", f"t{i}")] for i in range(10)]
    assert [len(texts) for _, texts in forward.batches] == [1, 10]


def test_batch_size_is_bounded_and_each_request_gets_its_own_rows():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=8, max_wait=0.2)
        batcher.start()
        tasks = [asyncio.create_task(batcher.submit("k", [f"r{i}-{j}" for j in range(3)])) for i in range(10)]
        big = asyncio.create_task(batcher.submit("k", [f"big{j}" for j in range(20)]))
        answers = await asyncio.gather(*tasks, big)
        await batcher.stop()
        return answers

    answers = run(go())
    for i, answer in enumerate(answers[:10]):
        assert answer == [("k", f"r{i}-{j}") for j in range(3)]
    assert answers[10] == [("k", f"big{j}") for j in range(20)]
    sizes = [len(texts) for _, texts in forward.batches]
    assert sorted(sizes) == sorted([6, 6, 6, 6, 6, 20])  # two 3-text requests per batch of <= 8; the big one alone
    assert sum(sizes) == 50


def test_keys_are_never_mixed_and_the_wait_gathers_stragglers():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=32, max_wait=2.0)
        batcher.start()
        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(batcher.submit(("ctx", i % 2), [f"t{i}"])))
            await asyncio.sleep(0.02)  # stragglers within the wait join their key's batch
        answers = await asyncio.gather(*tasks)
        await batcher.stop()
        return answers

    answers = run(go())
    assert answers == [[(("ctx", i % 2), f"t{i}")] for i in range(6)]
    assert sorted((key, tuple(texts)) for key, texts in forward.batches) == [
        (("ctx", 0), ("t0", "t2", "t4")),
        (("ctx", 1), ("t1", "t3", "t5")),
    ]


def test_a_lone_request_waits_at_most_max_wait():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=32, max_wait=0.1)
        batcher.start()
        started = time.monotonic()
        await batcher.submit("k", ["alone"])
        elapsed = time.monotonic() - started
        await batcher.stop()
        return elapsed

    assert 0.09 <= run(go()) < 5


def sample(batcher: DynamicBatcher, name: str) -> float:
    """One of the batcher's own metrics, as /metrics would export it."""
    return batcher.metrics.registry.get_sample_value(name)


def test_a_full_queue_refuses_at_once_and_recovers():
    forward = FakeForward()
    depths = []

    async def go():
        batcher = make(forward, max_batch_size=2, max_wait=0, max_queue=4)
        batcher.start()
        forward.gate.clear()
        running = asyncio.create_task(batcher.submit("k", ["running"]))
        await until_a_forward_runs(forward)  # held in the forward: the queue below is what waits
        queued = [asyncio.create_task(batcher.submit("k", [f"q{i}", f"q{i}b"])) for i in range(2)]
        await asyncio.sleep(0.01)
        assert batcher.pending == 4
        depths.append(sample(batcher, "cde_st_queue_depth_texts"))
        with pytest.raises(Overloaded) as refused:
            await batcher.submit("k", ["one too many"])
        assert refused.value.retry_after >= 1
        forward.gate.set()
        await asyncio.gather(running, *queued)
        # an empty queue admits even a request larger than the bound (it could never be served otherwise)
        alone = await batcher.submit("k", [f"w{i}" for i in range(6)])
        depths.append(sample(batcher, "cde_st_queue_depth_texts"))
        await batcher.stop()
        return alone

    assert len(run(go())) == 6
    assert depths == [4, 0]


def test_a_failed_forward_fails_its_requests_only():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=32, max_wait=0)
        batcher.start()
        forward.fail = ValueError("boom")
        with pytest.raises(ValueError, match="boom"):
            await batcher.submit("k", ["a"])
        forward.fail = None
        answer = await batcher.submit("k", ["b"])
        await batcher.stop()
        return answer

    assert run(go()) == [("k", "b")]


def test_a_cancelled_request_is_not_computed_and_stop_fails_the_queue():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=1, max_wait=0)
        batcher.start()
        forward.gate.clear()
        running = asyncio.create_task(batcher.submit("k", ["running"]))
        await until_a_forward_runs(forward)
        gone = asyncio.create_task(batcher.submit("k", ["client went away"]))
        kept = asyncio.create_task(batcher.submit("k", ["kept"]))
        await asyncio.sleep(0.01)
        gone.cancel()
        forward.gate.set()
        await asyncio.gather(running, kept)
        forward.gate.clear()
        forward.entered.clear()
        blocked = asyncio.create_task(batcher.submit("k", ["in flight"]))
        await until_a_forward_runs(forward)
        waiting = asyncio.create_task(batcher.submit("k", ["never run"]))
        await asyncio.sleep(0.01)
        await batcher.stop()
        forward.gate.set()
        for task in (blocked, waiting):
            with pytest.raises(Unavailable, match="shutting down"):
                await task
        return sample(batcher, "cde_st_abandoned_texts_total")

    assert run(go()) == 1  # the request whose client went away, counted by the batcher itself
    texts = [t for _, batch in forward.batches for t in batch]
    assert "client went away" not in texts and "never run" not in texts and "kept" in texts


def test_bounds_are_checked():
    with pytest.raises(ValueError):
        DynamicBatcher(lambda k, t: None, None, max_batch_size=0)
    with pytest.raises(Unavailable, match="start"):
        asyncio.run(DynamicBatcher(lambda k, t: None, None).submit("k", ["x"]))


class Sized(list):
    """A request's texts with their longest length in tokens, as the server's tokenised requests carry."""

    def __init__(self, texts, longest):
        super().__init__(texts)
        self.longest = longest


def test_batches_are_bounded_in_tokens_with_padding_and_in_texts():
    forward = FakeForward()

    async def go():
        batcher = make(forward, max_batch_size=8, max_wait=0.05, max_batch_tokens=100)
        batcher.start()
        forward.gate.clear()
        running = asyncio.create_task(batcher.submit("k", ["running"]))
        await until_a_forward_runs(forward)
        # 4 x 20 tokens fit; a 5th text of 30 makes 5 x 30 = 150 padded tokens: it waits for the next forward
        short = [asyncio.create_task(batcher.submit("k", Sized([f"s{i}"], 20))) for i in range(4)]
        await asyncio.sleep(0.01)
        long = asyncio.create_task(batcher.submit("k", Sized(["long"], 30)))
        huge = asyncio.create_task(batcher.submit("k", Sized(["huge"], 500)))  # over the budget alone: goes alone
        await asyncio.sleep(0.01)
        forward.gate.set()
        await asyncio.gather(running, *short, long, huge)
        await batcher.stop()

    run(go())
    assert [len(batch) for _, batch in forward.batches] == [1, 4, 1, 1]


def test_a_request_larger_than_the_queue_is_served_under_steady_load():
    forward = FakeForward()

    async def client(batcher, stop_at, refused):
        while time.monotonic() < stop_at:
            try:
                await batcher.submit("k", ["small", "small"])
            except Overloaded:
                refused.append(1)
                await asyncio.sleep(0.001)

    async def go():
        batcher = make(forward, max_batch_size=4, max_wait=0, max_queue=6)
        batcher.start()
        stop_at, refused = time.monotonic() + 3, []
        clients = [asyncio.create_task(client(batcher, stop_at, refused)) for _ in range(6)]
        await asyncio.sleep(0.2)  # steady load: the queue is never empty when the large request comes
        assert batcher.pending > 0
        large = await asyncio.wait_for(batcher.submit("k", [f"w{i}" for i in range(10)]), timeout=2)
        await asyncio.gather(*clients)
        await batcher.stop()
        return large, refused

    large, refused = run(go())
    assert len(large) == 10 and refused  # served; small requests were refused (429) while it waited


def test_a_dead_loop_fails_its_requests_with_503_and_is_restarted():
    forward = FakeForward()
    calls = []

    async def go():
        batcher = make(forward, max_batch_size=4, max_wait=0)
        observe = batcher.metrics.observe_batch

        def observe_batch(n_texts, n_requests):
            calls.append(n_texts)
            if len(calls) == 1:
                raise KeyError("a bug outside the forward kills the loop")
            observe(n_texts, n_requests)

        batcher.metrics.observe_batch = observe_batch
        batcher.start()
        with pytest.raises(Unavailable, match="loop failed"):
            await asyncio.wait_for(batcher.submit("k", ["first"]), timeout=5)
        answer = await asyncio.wait_for(batcher.submit("k", ["second"]), timeout=5)  # a new loop serves it
        restarts = batcher.restarts
        await batcher.stop()
        return answer, restarts

    assert run(go()) == ([("k", "second")], 1)


def test_the_batcher_counts_its_batches_and_times_its_forwards_in_the_registry_given():
    """The batcher owns its metrics: batch sizes, forward time and queue depth land in the server's registry."""
    from prometheus_client import CollectorRegistry

    forward, registry = FakeForward(), CollectorRegistry()

    async def go():
        batcher = DynamicBatcher(forward, ThreadPoolExecutor(max_workers=1), max_batch_size=8, max_wait=0,
                                 registry=registry)  # fmt: skip
        batcher.start()
        forward.gate.clear()
        first = asyncio.create_task(batcher.submit("k", ["a"]))
        await until_a_forward_runs(forward)
        rest = [asyncio.create_task(batcher.submit("k", [f"t{i}", f"u{i}"])) for i in range(3)]
        await asyncio.sleep(0.01)
        forward.gate.set()
        await asyncio.gather(first, *rest)
        await batcher.stop()

    run(go())
    assert registry.get_sample_value("cde_st_batch_size_texts_sum") == 7  # 1, then 3 requests of 2 in one batch
    assert registry.get_sample_value("cde_st_batch_size_requests_sum") == 4
    assert registry.get_sample_value("cde_st_batch_size_texts_count") == 2
    assert registry.get_sample_value("cde_st_forward_seconds_count") == 2
    assert registry.get_sample_value("cde_st_queue_depth_texts") == 0
