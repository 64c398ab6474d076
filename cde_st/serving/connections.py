"""Bounds on connections: time limits for a request to arrive, a share of the connections per client address, and
the HTTP protocol that enforces them.

uvicorn closes a connection idle *after* an answer (``timeout_keep_alive``) but gives a connection that opened and
sends nothing, or sends its headers or body a byte at a time, all the time it wants: a thousand such sockets hold
a thousand file descriptors and the server stops accepting (``/health`` times out). :func:`read_timeout_protocol`
makes uvicorn's h11 protocol close a connection whose request head (request line and headers) has not arrived
within ``head_timeout`` seconds of the connection opening or of the previous answer, and one whose whole request
(headers and body) has not arrived within ``seconds``. ``--max-connections`` (uvicorn's ``limit_concurrency``) caps
what is left: past it uvicorn answers 503 at once, except ``/health`` and ``/ready``, which are answered whatever
other clients hold (a probe that failed because of them would restart or unroute a healthy server). One address
may hold at most ``max_per_peer`` connections (default: half of ``--max-connections``): a connection past that is
closed as it opens, so one client cannot keep all others out by opening sockets faster than they time out.
``--max-requests-per-connection`` ends a keep-alive connection after that many answers (the last says
``Connection: close``), so that with ``--workers`` a long-lived client's connection does not stay on one worker for
good, and ``--max-connection-age-s`` does the same for a connection open that long: slow clients (a request every
few seconds) would take hours to reach a request count.
"""

from __future__ import annotations

from collections import Counter

import h11
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from cde_st.serving import defaults

__all__ = ["ALWAYS_ANSWERED", "ReadTimeoutH11Protocol", "read_timeout_protocol"]


#: Paths answered past ``--max-connections``: probes that must not fail because of other clients.
ALWAYS_ANSWERED = ("/health", "/ready")


class ReadTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of the module docstring: a request head within ``head_timeout`` and a
    whole request within ``read_timeout`` seconds of the connection opening or the previous answer, at most
    ``max_per_peer`` connections per client address, probes answered past the connection limit."""

    read_timeout = defaults.READ_TIMEOUT_S  # read_timeout_protocol gives each server its own
    head_timeout = defaults.HEAD_TIMEOUT_S
    max_requests: int | None = None  # per connection; the last one's answer says "Connection: close"
    max_age: float | None = None  # seconds; the first request after it gets "Connection: close"
    max_per_peer: int | None = None  # connections one client address may hold
    peers: Counter = Counter()  # open connections per client address: read_timeout_protocol gives each server its own
    warned: set = set()  # addresses whose refusal was logged
    _opened = 0.0
    _read_timer = _head_timer = None
    _peer = None  # the client address this connection counts against
    _requests = 0
    _counted = None  # the request cycle last counted
    _limit = None

    @property
    def limit_concurrency(self) -> int | None:
        """uvicorn reads it once per request, right after the request head is parsed: None lets a probe through
        whatever the other connections hold."""
        scope = self.scope
        return None if scope is not None and scope.get("path") in ALWAYS_ANSWERED else self._limit

    @limit_concurrency.setter
    def limit_concurrency(self, value: int | None) -> None:
        self._limit = value

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        peer = self.client[0] if self.client else None
        if peer is not None and self.max_per_peer is not None and self.peers[peer] >= self.max_per_peer:
            if peer not in self.warned and len(self.warned) < 1000:  # once per address: refusals come by thousands
                self.warned.add(peer)
                self.logger.warning("%s holds %d connections, the most one address may: new ones are closed.",
                                    peer, self.max_per_peer)  # fmt: skip
            transport.close()
            return
        if peer is not None:
            self._peer = peer
            self.peers[peer] += 1
        self._arm_timers()

    def _arm_timers(self) -> None:
        self._cancel_timers()
        self._read_timer = self.loop.call_later(self.read_timeout, self._read_timed_out)
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_timers(self, head_only: bool = False) -> None:
        for name in ("_head_timer",) if head_only else ("_head_timer", "_read_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.conn.their_state not in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED) and not self.transport.is_closing():
            self.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # no request head yet
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle is not self._counted:  # a new request: its app has not started yet
            self._cancel_timers(head_only=True)
            self._counted, self._requests = cycle, self._requests + 1
            if (self.max_requests is not None and self._requests >= self.max_requests) or (
                self.max_age is not None and self.loop.time() - self._opened >= self.max_age
            ):
                # uvicorn answers a request that asked to close with "Connection: close" and then closes: the
                # client opens a new connection, which any of the workers sharing the port may accept.
                cycle.scope["headers"].append(CLOSE_HEADER)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._cancel_timers()  # the request has arrived: the time limit now is the work's, not ours

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_timers()

    def connection_lost(self, exc) -> None:
        self._cancel_timers()
        if self._peer is not None:
            self.peers[self._peer] -= 1
            if self.peers[self._peer] <= 0:
                del self.peers[self._peer]
            self._peer = None
        super().connection_lost(exc)


def read_timeout_protocol(
    seconds: float,
    max_requests: int | None = None,
    max_age: float | None = None,
    head_timeout: float = defaults.HEAD_TIMEOUT_S,
    max_per_peer: int | None = None,
) -> type[ReadTimeoutH11Protocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for a request time limit of ``seconds`` (its head
    within ``head_timeout``), at most ``max_requests`` requests per connection, requests on a connection at most
    ``max_age`` seconds old and at most ``max_per_peer`` connections per client address (None: no limit)."""
    if not seconds > 0 or not head_timeout > 0:  # also NaN
        raise ValueError(f"the request time limits must be > 0 seconds, got {seconds} and {head_timeout}.")
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"the requests per connection must be >= 1, got {max_requests}.")
    if max_age is not None and not max_age > 0:
        raise ValueError(f"the connection age limit must be > 0 seconds, got {max_age}.")
    if max_per_peer is not None and max_per_peer < 1:
        raise ValueError(f"the connections per client address must be >= 1, got {max_per_peer}.")
    fields = {
        "read_timeout": float(seconds),
        "head_timeout": float(min(head_timeout, seconds)),
        "max_requests": max_requests,
        "max_age": max_age,
        "max_per_peer": max_per_peer,
        "peers": Counter(),
        "warned": set(),
    }
    return type("ReadTimeoutH11Protocol", (ReadTimeoutH11Protocol,), fields)
