"""Dynamic batching: concurrent requests that can share a forward pass are coalesced into one.

Requests with the same key (the server's key: context and input type) queue together. One loop takes the key whose
oldest request waited longest, waits at most ``max_wait`` seconds *from that request's arrival* for more texts of
the same key (requests that queued during the previous forward are not delayed again), takes up to
``max_batch_size`` texts and, when set, ``max_batch_tokens`` tokens counted with padding (texts times the longest;
a larger single request goes alone), and runs the forward in the executor, one at a time. The batcher keeps its
own metrics (:class:`~cde_st.serving.metrics.QueueMetrics`: batch sizes, queue depth, forward time, texts whose
clients left), in the registry the server gives it.

The queue is bounded in texts: a request that would overflow it is refused at once with :class:`Overloaded` (the
server answers 429 with ``Retry-After``), instead of growing without limit or timing out silently. A request
larger than the whole queue cannot wait for room beside others: it waits for the queue to empty, and while it
waits new requests are refused, so it is served under any steady load instead of being refused forever.

The loop is supervised: if it ever fails outside a forward, every request it held or queued gets
:class:`Unavailable` (503) and a new loop starts, so no request waits forever on a dead loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sized
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from cde_st.serving import defaults
from cde_st.serving.metrics import QueueMetrics

__all__ = ["DynamicBatcher", "Overloaded", "Unavailable"]

logger = logging.getLogger(__name__)


class Overloaded(Exception):
    """The queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, pending: int, limit: int, retry_after: int = 1) -> None:
        super().__init__(f"{pending} texts are already queued (limit {limit}); retry in {retry_after} s.")
        self.retry_after = retry_after


class Unavailable(Exception):
    """The batcher cannot serve the request (shutting down, or its loop failed and was restarted); retry after
    ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Request:
    payload: Sized
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def longest(self) -> int:
        return int(getattr(self.payload, "longest", 1))


class DynamicBatcher:
    """``forward(key, payloads)`` is the model's forward (blocking, run in ``executor``; the server's engine) of the
    payloads batched together (each what one request submitted: a sized object, e.g. its tokenised texts, whose
    ``longest`` attribute, if any, is its longest text in tokens); it returns an object whose ``rows(start, stop)``
    gives one request's part, rows counted across the payloads in order. :attr:`metrics` (in ``registry``; None:
    one of its own) counts the batches, the queue depth, the forwards' time and the texts of requests whose clients
    left before their forward (skipped, never computed)."""

    def __init__(
        self,
        forward: Callable[[Hashable, list], Any],
        executor: Executor,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        max_wait: float = defaults.MAX_WAIT_MS / 1000,
        max_queue: int = defaults.MAX_QUEUE,
        max_batch_tokens: int | None = defaults.MAX_BATCH_TOKENS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if (
            max_batch_size < 1
            or max_queue < 1
            or max_wait < 0
            or (max_batch_tokens is not None and max_batch_tokens < 1)
        ):
            raise ValueError("max_batch_size, max_queue and max_batch_tokens must be >= 1 and max_wait >= 0.")
        self.forward, self.executor = forward, executor
        self.max_batch_size, self.max_wait, self.max_queue = max_batch_size, max_wait, max_queue
        self.max_batch_tokens = max_batch_tokens
        self.metrics = QueueMetrics(registry)
        self._queues: OrderedDict[Hashable, deque[_Request]] = OrderedDict()
        self._pending = 0  # texts queued, not yet handed to a forward
        self._arrival: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None  # set whenever nothing is queued
        self._oversized: asyncio.Future | None = None  # a request larger than the queue, waiting for it to empty
        self._running: list[_Request] = []  # the requests of the forward in progress
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.restarts = 0

    @property
    def pending(self) -> int:
        return self._pending

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._arrival, self._drained = asyncio.Event(), asyncio.Event()
        self._drained.set()
        self._stopping = False
        self._spawn()

    def _spawn(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self._task.add_done_callback(self._supervise)

    def _supervise(self, task: asyncio.Task) -> None:
        """The loop ended: on a failure (never on a stop), fail what it held and start a new one."""
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        logger.error("The batching loop failed; its requests get 503 and it is restarted.", exc_info=error)
        self._fail_all(Unavailable(f"The batching loop failed ({type(error).__name__}: {error}); retry."))
        self.restarts += 1
        self._spawn()

    def _fail_all(self, error: Exception) -> None:
        for request in self._running + [r for queue in self._queues.values() for r in queue]:
            if not request.future.done():
                request.future.set_exception(error)
        self._running = []
        self._queues.clear()
        self._set_pending(0)

    async def stop(self) -> None:
        """Stop the loop; requests still queued or in a forward get :class:`Unavailable`."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        self._fail_all(Unavailable("The server is shutting down."))

    async def submit(self, key: Hashable, payload: Sized) -> Any:
        """Queue ``payload`` (one request's texts) under ``key`` and wait for its rows of the batch it is in."""
        if self._task is None or self._stopping:
            raise Unavailable("The server is shutting down." if self._stopping else "The batcher is not started.")
        size = len(payload)
        if self._oversized is not None or (self._pending and self._pending + size > self.max_queue):
            if size <= self.max_queue or self._oversized is not None:
                raise Overloaded(self._pending, self.max_queue)
            await self._wait_for_empty_queue()
        request = _Request(payload, asyncio.get_running_loop().create_future())
        self._queues.setdefault(key, deque()).append(request)
        self._set_pending(self._pending + size)
        self._arrival.set()
        return await request.future

    async def _wait_for_empty_queue(self) -> None:
        """Hold new requests off (they get 429) until the queue is empty, for a request larger than the queue."""
        self._oversized = asyncio.get_running_loop().create_future()
        try:
            while self._pending:
                self._drained.clear()
                await self._drained.wait()
        finally:
            self._oversized = None

    def _set_pending(self, pending: int) -> None:
        self._pending = pending
        if pending == 0 and self._drained is not None:
            self._drained.set()
        self.metrics.queue_depth.set(pending)

    def _full(self, key: Hashable) -> bool:
        """Whether the requests queued under ``key`` fill a batch (texts, or tokens with padding)."""
        queue = self._queues.get(key, ())
        size = sum(r.size for r in queue)
        if size >= self.max_batch_size:
            return True
        return self.max_batch_tokens is not None and size * max((r.longest for r in queue), default=0) >= (
            self.max_batch_tokens
        )

    def _fits(self, size: int, longest: int) -> bool:
        if size > self.max_batch_size:
            return False
        return self.max_batch_tokens is None or size * longest <= self.max_batch_tokens

    def _oldest_key(self) -> Hashable:
        return min(self._queues, key=lambda k: self._queues[k][0].arrived)

    def _take(self, key: Hashable) -> list[_Request]:
        queue, taken, size, longest = self._queues[key], [], 0, 0
        while queue and (not taken or self._fits(size + queue[0].size, max(longest, queue[0].longest))):
            request = queue.popleft()
            self._pending -= request.size
            if request.future.done():  # the client went away (its handler was cancelled): nothing to compute
                self.metrics.abandoned_texts.inc(request.size)
                continue
            taken.append(request)
            size, longest = size + request.size, max(longest, request.longest)
        if not queue:
            del self._queues[key]
        self._set_pending(self._pending)
        return taken

    async def _next_batch(self) -> tuple[Hashable, list[_Request]]:
        while not self._queues:
            self._arrival.clear()
            await self._arrival.wait()
        key = self._oldest_key()
        deadline = self._queues[key][0].arrived + self.max_wait
        while not self._full(key) and (remaining := deadline - time.monotonic()) > 0:
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except asyncio.TimeoutError:
                break
        return key, self._take(key)

    def _timed(self, key: Hashable, payloads: list) -> Any:
        """The forward, timed where it runs (the executor's thread), so the time is the model's, not the queue's."""
        started = time.perf_counter()
        result = self.forward(key, payloads)
        self.metrics.forward_seconds.observe(time.perf_counter() - started)
        return result

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key, batch = await self._next_batch()
            if not batch:
                continue
            self._running = batch
            self.metrics.observe_batch(sum(r.size for r in batch), len(batch))
            try:
                result = await loop.run_in_executor(self.executor, self._timed, key, [r.payload for r in batch])
            except asyncio.CancelledError:
                raise  # stopping: stop() fails the running requests
            except Exception as exc:  # the forward failed: every request of the batch gets the error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self._running = []
                continue
            start = 0
            for request in batch:
                stop = start + request.size
                if not request.future.done():
                    request.future.set_result(result.rows(start, stop))
                start = stop
            self._running = []
