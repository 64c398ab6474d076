"""Whether the server can answer embeddings now, which ``/ready`` reports: the model has answered a warm-up
forward, and with ``--model-process`` the child that runs the forwards is up.

The warm-up is one forward of one text (so the first request does not pay for lazy initialisation), then, with
``forward_overhead_tokens="auto"``, the forwards that measure what one more forward costs, which decides where
batches are cut (:meth:`~cde_st.serving.engine.Engine.measure_forward_overhead`). A warm-up that fails in the model
itself (a model giving NaN) leaves ``/ready`` at 503 for good: the server still answers, with errors.

A model process can end at any time (killed, out of memory), while it loads or later. Readiness follows it: 503
from the moment it ended until a new one has answered a warm-up forward, and :meth:`Readiness.watch` starts that new
one between batches without waiting for a request (:meth:`~cde_st.serving.model_process.ModelProcess.ensure_ready`
through a forward), so a replica a load balancer stopped routing to comes back by itself (a child killed while it
loaded once left ``/ready`` at 503 for good, while requests started a new child and were answered).
"""

from __future__ import annotations

import asyncio
import logging

from cde_st.serving.model_process import ModelProcessFailed

__all__ = ["WATCH_SECONDS", "Readiness"]

logger = logging.getLogger(__name__)

#: How often the watch looks at the model process; a failed start waits up to 32 times as long before the next.
WATCH_SECONDS = 0.5


class Readiness:
    """The warm-up and readiness of ``engine`` (an :class:`~cde_st.serving.engine.Engine`). ``overhead``: the
    settings' ``forward_overhead_tokens`` ("auto": measured in the warm-up); ``observe_overhead(tokens)`` records
    it (a metric); ``context()`` gives the context the warm-up forwards use."""

    def __init__(self, engine, overhead, observe_overhead, context) -> None:
        self.engine, self.overhead, self.observe_overhead, self.context = engine, overhead, observe_overhead, context
        self.warmed = False  # a warm-up forward was answered (by the running model process, if there is one)
        self.broken = False  # the warm-up failed in the model itself: not retried
        self._measured = False

    def problem(self) -> str | None:
        """Why the server is not ready (None: it is)."""
        process = self.engine.model_process
        if self.broken:
            return "The model failed its warm-up forward (see the server log)."
        if not self.warmed:
            return "The model is still loading."
        if process is not None and not process.ready:
            return "The model's process ended and a new one is starting."
        return None

    async def warm_up(self) -> bool:
        """One warm-up forward (starting a model process if none runs) and, the first time, the forward-cost
        measurement; whether it was answered."""
        loop = asyncio.get_running_loop()
        engine = self.engine
        tokens = await loop.run_in_executor(engine.tokenizer_executor, engine.tokenize, ["warm up"], None)
        context = self.context()
        self.warmed = False
        try:
            await loop.run_in_executor(engine.executor, engine.embed_tokens, [tokens], context)
            if not self._measured:
                await self._measure(loop, context)
        except ModelProcessFailed as exc:  # ended while loading or under the forward: the watch starts another
            logger.warning("The warm-up forward was not answered (%s); /ready answers 503 until it is.", exc)
            return False
        except Exception:  # e.g. a model giving NaN: the server still answers (errors), /ready says it is not ready
            logger.exception("The warm-up forward failed: /ready answers 503.")
            self.broken = True
            return False
        self.warmed = True
        return True

    async def _measure(self, loop, context) -> None:
        engine, overhead = self.engine, self.overhead
        if overhead == "auto":
            probes = await loop.run_in_executor(engine.tokenizer_executor, engine.forward_probes)
            overhead = await loop.run_in_executor(engine.executor, engine.measure_forward_overhead, probes, context)
            if overhead is not None:
                logger.info("One more forward costs about %.0f tokens: batches are cut where padding costs more.",
                            overhead)  # fmt: skip
        else:
            engine.forward_overhead_tokens = overhead
        self.observe_overhead(overhead or 0)
        self._measured = True

    async def watch(self) -> None:
        """Until cancelled: when the model process has ended (or never answered a warm-up), warm up again, which
        starts a new one; failed starts are retried less and less often. Without a model process it returns."""
        process = self.engine.model_process
        if process is None:
            return
        failures = 0
        while True:
            await asyncio.sleep(WATCH_SECONDS * 2 ** min(failures, 5))
            if self.broken or (self.warmed and process.running):
                failures = 0
                continue
            failures = 0 if await self.warm_up() else failures + 1
