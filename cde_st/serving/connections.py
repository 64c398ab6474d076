"""Bounds on connections: a time limit for a request to arrive, and the HTTP protocol that enforces it.

uvicorn closes a connection idle *after* an answer (``timeout_keep_alive``) but gives a connection that opened and
sends nothing, or sends its headers or body a byte at a time, all the time it wants: a thousand such sockets hold
a thousand file descriptors and the server stops accepting (``/health`` times out). :func:`read_timeout_protocol`
makes uvicorn's h11 protocol close a connection whose request (headers and body) has not fully arrived within
``seconds`` of the connection opening or of the previous answer. ``--max-connections`` (uvicorn's
``limit_concurrency``) caps what is left: past it uvicorn answers 503 at once. ``--max-requests-per-connection``
ends a keep-alive connection after that many answers (the last says ``Connection: close``), so that with
``--workers`` a long-lived client's connection does not stay on one worker for good, and
``--max-connection-age-s`` does the same for a connection open that long: slow clients (a request every few
seconds) would take hours to reach a request count.
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from cde_st.serving import defaults

__all__ = ["ReadTimeoutH11Protocol", "read_timeout_protocol"]


class ReadTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request is not complete ``read_timeout`` seconds after
    the connection opened or the previous answer was sent."""

    read_timeout = defaults.READ_TIMEOUT_S  # read_timeout_protocol gives each server its own
    max_requests: int | None = None  # per connection; the last one's answer says "Connection: close"
    max_age: float | None = None  # seconds; the first request after it gets "Connection: close"
    _opened = 0.0
    _read_timer = None
    _requests = 0
    _counted = None  # the request cycle last counted

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        self._arm_read_timer()

    def _arm_read_timer(self) -> None:
        self._cancel_read_timer()
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED) and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not self._counted:  # a new request: its app has not started yet
            self._counted, self._requests = cycle, self._requests + 1
            if (self.max_requests is not None and self._requests >= self.max_requests) or (
                self.max_age is not None and self.loop.time() - self._opened >= self.max_age
            ):
                # uvicorn answers a request that asked to close with "Connection: close" and then closes: the
                # client opens a new connection, which any of the workers sharing the port may accept.
                cycle.scope["headers"].append(CLOSE_HEADER)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._cancel_read_timer()  # the request has arrived: the time limit now is the work's, not ours

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_read_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)


def read_timeout_protocol(
    seconds: float, max_requests: int | None = None, max_age: float | None = None
) -> type[ReadTimeoutH11Protocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for a request time limit of ``seconds``, at
    most ``max_requests`` requests per connection and requests on a connection at most ``max_age`` seconds old
    (None: no limit)."""
    if seconds <= 0:
        raise ValueError(f"the request read timeout must be > 0 seconds, got {seconds}.")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"the requests per connection must be >= 1, got {max_requests}.")
    if max_age is not None and not max_age > 0:
        raise ValueError(f"the connection age limit must be > 0 seconds, got {max_age}.")
    fields = {"read_timeout": float(seconds), "max_requests": max_requests, "max_age": max_age}
    return type("ReadTimeoutH11Protocol", (ReadTimeoutH11Protocol,), fields)
