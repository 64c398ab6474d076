"""The middleware every HTTP exchange goes through, driven as ASGI: a request id echoed or made, on the answer and on
the log lines of the request; requests in flight counted (an app error included); while draining, new requests get
503 with ``Retry-After`` except ``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest

from cde_st.serving.traffic import REQUEST_ID, RequestIdFilter, Traffic, TrafficState


class App:
    """An ASGI app that answers 200 and records the request id and the requests in flight it saw."""

    def __init__(self, state: TrafficState, fail: bool = False) -> None:
        self.state, self.fail, self.seen = state, fail, []

    async def __call__(self, scope, receive, send) -> None:
        self.seen.append((scope["type"], REQUEST_ID.get(), self.state.in_flight))
        logging.getLogger("cde_st.test_traffic").warning("handling")
        if self.fail:
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


def _exchange(middleware: Traffic, path: str = "/v1/embeddings", headers=()) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request through ``middleware``."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": list(headers)}
    asyncio.run(middleware(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_a_usable_request_id_is_echoed_and_seen_by_the_app_and_its_logs(caplog):
    state = TrafficState()
    app = App(state)
    ids = RequestIdFilter()
    caplog.handler.addFilter(ids)
    try:
        with caplog.at_level(logging.WARNING, logger="cde_st.test_traffic"):
            status, headers, _ = _exchange(Traffic(app, state), headers=[(b"X-Request-Id", b"abc-123")])
            logging.getLogger("cde_st.test_traffic").warning("outside")
    finally:
        caplog.handler.removeFilter(ids)
    assert status == 200 and headers["x-request-id"] == "abc-123" and headers["content-type"] == "text/plain"
    assert app.seen == [("http", "abc-123", 1)] and state.in_flight == 0
    assert [(r.getMessage(), r.request_id) for r in caplog.records] == [("handling", "abc-123"), ("outside", "-")]


@pytest.mark.parametrize("given", [b"", b"has space", b"x" * 129, "caf\u00e9".encode()])
def test_an_unusable_request_id_is_replaced_by_a_new_one(given):
    state = TrafficState()
    app = App(state)
    _, headers, _ = _exchange(Traffic(app, state), headers=[(b"x-request-id", given)])
    assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"]) and app.seen[0][1] == headers["x-request-id"]
    _, again, _ = _exchange(Traffic(app, state))
    assert re.fullmatch(r"[0-9a-f]{32}", again["x-request-id"]) and again["x-request-id"] != headers["x-request-id"]


def test_a_request_the_app_fails_is_no_longer_in_flight():
    state = TrafficState()
    with pytest.raises(RuntimeError, match="the app failed"):
        _exchange(Traffic(App(state, fail=True), state))
    assert state.in_flight == 0 and REQUEST_ID.get() == "-"


def test_while_draining_new_requests_get_503_but_health_and_metrics_answer():
    state = TrafficState(retry_after=7)
    state.draining = True
    app = App(state)
    status, headers, body = _exchange(Traffic(app, state), headers=[(b"x-request-id", b"r1")])
    assert status == 503 and app.seen == []  # the app never saw it
    assert (headers["retry-after"], headers["connection"], headers["x-request-id"]) == ("7", "close", "r1")
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("shutting_down", "server_error") and "retry" in error["message"]
    for path in ("/health", "/metrics"):
        assert _exchange(Traffic(app, state), path=path)[0] == 200
    assert len(app.seen) == 2


def test_other_scopes_pass_through_untouched():
    state = TrafficState()
    state.draining = True
    app, sent = App(state), []

    async def send(message):
        sent.append(message)

    asyncio.run(Traffic(app, state)({"type": "lifespan"}, None, send))
    assert app.seen == [("lifespan", "-", 0)]  # not refused, not counted, no request id
    assert sent[0]["headers"] == [(b"content-type", b"text/plain")]
