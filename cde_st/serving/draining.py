"""Graceful shutdown: on SIGTERM (or SIGINT) the server drains, then exits 0.

uvicorn's own handling stops listening at once (a client then sees a refused connection, not an answer to retry
elsewhere) and re-raises the signal after its shutdown, so the process ends killed by it rather than with status 0.
:class:`DrainingServer` instead marks the app as draining (:class:`~cde_st.serving.traffic.TrafficState`: new
requests get 503 with ``Retry-After``, ``/ready`` says 503 so a load balancer stops sending), lets the requests in
flight finish, and only then starts uvicorn's shutdown; it exits 0. It gives up waiting after ``drain_timeout``
seconds; a second signal exits at once. ``on_started`` is called once the app has started (the model loaded and warmed
up) and the server accepts connections: ``--workers`` tells a worker that failed at start from one that died later.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import uvicorn

from cde_st.serving import defaults
from cde_st.serving.traffic import TrafficState

__all__ = ["DrainingServer"]

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` that drains ``traffic`` before shutting down (see the module docstring)."""

    def __init__(
        self,
        config: uvicorn.Config,
        traffic: TrafficState,
        drain_timeout: float = defaults.DRAIN_TIMEOUT_S,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.traffic, self.drain_timeout, self.on_started = traffic, drain_timeout, on_started
        self._drain_deadline: float | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit and self.on_started is not None:  # should_exit: the app's start-up failed
            self.on_started()

    def handle_exit(self, sig: int, frame) -> None:
        if self._drain_deadline is not None:  # a second signal: stop now (uvicorn's own handling)
            super().handle_exit(sig, frame)
            return
        logger.info(
            "%s: draining (%d requests in flight; new ones get 503).", signal.Signals(sig).name, self.traffic.in_flight
        )
        self.traffic.draining = True
        self._drain_deadline = time.monotonic() + self.drain_timeout

    async def on_tick(self, counter: int) -> bool:
        """Called by uvicorn's main loop every 0.1 s: exit once drained (or past the drain deadline)."""
        if self._drain_deadline is not None and not self.should_exit:
            if self.traffic.in_flight == 0 or time.monotonic() >= self._drain_deadline:
                if self.traffic.in_flight:
                    logger.warning("Drain timeout: %d requests still in flight are cut.", self.traffic.in_flight)
                self.should_exit = True
        return await super().on_tick(counter)
