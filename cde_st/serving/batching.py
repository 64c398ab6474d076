"""Dynamic batching: concurrent requests that can share a forward pass are coalesced into one.

Requests with the same key (the server's key: context and input type) queue together. One loop takes the key whose
oldest request waited longest, waits at most ``max_wait`` seconds *from that request's arrival* for more texts of
the same key (requests that queued during the previous forward are not delayed again), takes up to
``max_batch_size`` texts (a larger single request goes alone), and runs the forward in the executor, one at a time.
The queue is bounded in texts: a request that would overflow it is refused at once with :class:`Overloaded` (the
server answers 429 with ``Retry-After``), instead of growing without limit or timing out silently.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any


class Overloaded(Exception):
    """The queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, pending: int, limit: int, retry_after: int = 1) -> None:
        super().__init__(f"{pending} texts are already queued (limit {limit}); retry in {retry_after} s.")
        self.retry_after = retry_after


@dataclass
class _Request:
    texts: list
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class DynamicBatcher:
    """``run(key, texts)`` is the forward (blocking, run in ``executor``); it returns an object whose
    ``rows(start, stop)`` gives one request's part. ``on_batch(n_texts, n_requests)`` and ``on_queue(n_texts)``
    observe batch sizes and queue depth (metrics)."""

    def __init__(
        self,
        run: Callable[[Hashable, list], Any],
        executor: Executor,
        max_batch_size: int = 32,
        max_wait: float = 0.005,
        max_queue: int = 1024,
        on_batch: Callable[[int, int], None] | None = None,
        on_queue: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_wait >= 0.")
        self.run, self.executor = run, executor
        self.max_batch_size, self.max_wait, self.max_queue = max_batch_size, max_wait, max_queue
        self.on_batch, self.on_queue = on_batch, on_queue
        self._queues: OrderedDict[Hashable, deque[_Request]] = OrderedDict()
        self._pending = 0  # texts queued, not yet handed to a forward
        self._arrival: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def pending(self) -> int:
        return self._pending

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._arrival = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for queue in self._queues.values():
            for request in queue:
                if not request.future.done():
                    request.future.set_exception(RuntimeError("The server is shutting down."))
        self._queues.clear()

    async def submit(self, key: Hashable, texts: list) -> Any:
        """Queue ``texts`` under ``key`` and wait for their rows of the batch they are embedded in."""
        if self._task is None:
            raise RuntimeError("DynamicBatcher.start() was not called.")
        if self._pending and self._pending + len(texts) > self.max_queue:
            raise Overloaded(self._pending, self.max_queue)
        request = _Request(texts, asyncio.get_running_loop().create_future())
        self._queues.setdefault(key, deque()).append(request)
        self._pending += len(texts)
        self._observe_queue()
        self._arrival.set()
        return await request.future

    def _observe_queue(self) -> None:
        if self.on_queue is not None:
            self.on_queue(self._pending)

    def _queued(self, key: Hashable) -> int:
        return sum(len(r.texts) for r in self._queues.get(key, ()))

    def _oldest_key(self) -> Hashable:
        return min(self._queues, key=lambda k: self._queues[k][0].arrived)

    def _take(self, key: Hashable) -> list[_Request]:
        queue, taken, size = self._queues[key], [], 0
        while queue and (not taken or size + len(queue[0].texts) <= self.max_batch_size):
            request = queue.popleft()
            self._pending -= len(request.texts)
            if request.future.done():  # the client went away (its handler was cancelled): nothing to compute
                continue
            taken.append(request)
            size += len(request.texts)
        if not queue:
            del self._queues[key]
        self._observe_queue()
        return taken

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queues:
                self._arrival.clear()
                await self._arrival.wait()
            key = self._oldest_key()
            deadline = self._queues[key][0].arrived + self.max_wait
            while self._queued(key) < self.max_batch_size and (remaining := deadline - time.monotonic()) > 0:
                self._arrival.clear()
                try:
                    await asyncio.wait_for(self._arrival.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._take(key)
            if not batch:
                continue
            texts = [text for request in batch for text in request.texts]
            if self.on_batch is not None:
                self.on_batch(len(texts), len(batch))
            try:
                result = await loop.run_in_executor(self.executor, self.run, key, texts)
            except asyncio.CancelledError:  # shutting down mid-forward: no request is left waiting forever
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(RuntimeError("The server is shutting down."))
                raise
            except Exception as exc:  # the forward failed: every request of the batch gets the error
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            start = 0
            for request in batch:
                stop = start + len(request.texts)
                if not request.future.done():
                    request.future.set_result(result.rows(start, stop))
                start = stop
