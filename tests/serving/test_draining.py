"""Graceful shutdown: a first signal drains (new requests refused, the server exits once none is in flight or at the
drain deadline), a second exits at once, and a drained server returns instead of re-raising the signal; the start
callback runs only once the app has started."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="the server needs the serve extra (pip install -e '.[dev]')")

from cde_st.serving.draining import DrainingServer  # noqa: E402
from cde_st.serving.traffic import TrafficState  # noqa: E402


def _app(start: str = "lifespan.startup.complete"):
    """An ASGI app that only answers its lifespan (``start``: how its start-up ends)."""

    async def app(scope, receive, send) -> None:
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": start})
            if start != "lifespan.startup.complete":
                return
        await send({"type": "lifespan.shutdown.complete"})

    return app


def _server(app=None, **kwargs) -> DrainingServer:
    config = uvicorn.Config(app or _app(), host="127.0.0.1", port=0, lifespan="on", log_level="critical")
    return DrainingServer(config, TrafficState(), **kwargs)


def test_a_signal_drains_until_no_request_is_in_flight(caplog):
    server = _server(drain_timeout=60)
    assert asyncio.run(server.on_tick(1)) is False and not server.traffic.draining  # no signal: nothing changes
    server.traffic.in_flight = 2
    with caplog.at_level(logging.INFO, logger="cde_st.serving.draining"):
        server.handle_exit(signal.SIGTERM, None)
    assert server.traffic.draining and not server.should_exit
    assert "SIGTERM: draining (2 requests in flight; new ones get 503)." in caplog.messages
    assert asyncio.run(server.on_tick(1)) is False
    server.traffic.in_flight = 0
    assert asyncio.run(server.on_tick(1)) is True and server.should_exit


def test_the_drain_deadline_cuts_the_requests_left(caplog):
    server = _server(drain_timeout=0)
    server.traffic.in_flight = 3
    server.handle_exit(signal.SIGTERM, None)
    with caplog.at_level(logging.WARNING, logger="cde_st.serving.draining"):
        assert asyncio.run(server.on_tick(1)) is True
    assert "Drain timeout: 3 requests still in flight are cut." in caplog.messages


def test_a_second_signal_exits_at_once():
    server = _server(drain_timeout=60)
    server.traffic.in_flight = 1
    server.handle_exit(signal.SIGINT, None)
    assert not server.should_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and asyncio.run(server.on_tick(1)) is True


def test_a_drained_server_returns_without_re_raising_the_signal_and_started_once(monkeypatch):
    raised = []
    monkeypatch.setattr(signal, "raise_signal", raised.append)  # what uvicorn's own shutdown ends with
    started = []

    def on_started() -> None:
        started.append(server.started)
        server.handle_exit(signal.SIGTERM, None)  # as if SIGTERM arrived once the server listens

    server = _server(drain_timeout=60, on_started=on_started)
    asyncio.run(server.serve())
    assert started == [True] and server.traffic.draining and raised == []


def test_a_failed_start_up_does_not_count_as_started():
    started = []
    server = _server(_app("lifespan.startup.failed"), on_started=lambda: started.append(1))
    with pytest.raises(SystemExit):  # uvicorn's exit status for a failed start-up
        asyncio.run(server.serve())
    assert started == []
