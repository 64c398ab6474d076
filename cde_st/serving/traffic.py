"""What every HTTP exchange goes through before a route: a request id, the count of requests in flight, and the
refusal of new work while the server drains.

- ``X-Request-Id``: the client's value is echoed (if it is 1 to 128 visible ASCII characters), otherwise one is made;
  it is on every response and, through :class:`RequestIdFilter`, on every log line written while the request is
  handled (``%(request_id)s``; ``-`` outside a request).
- Draining (after SIGTERM, see :mod:`cde_st.serving.serve_command`): new requests get 503 with ``Retry-After``,
  except ``/health`` and ``/metrics`` (the process is alive and observable until it exits); requests already in
  flight finish, and the server exits once none is left.
"""

from __future__ import annotations

import contextvars
import json
import logging
import uuid

__all__ = ["REQUEST_ID", "RequestIdFilter", "Traffic", "TrafficState"]

#: The id of the request being handled (``-`` outside one).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_ALWAYS_SERVED = ("/health", "/metrics")


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record (put it on a handler, so records of every logger get it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def _given_id(headers: list) -> str | None:
    for name, value in headers:
        if name.lower() == b"x-request-id":
            if 1 <= len(value) <= 128 and all(33 <= b <= 126 for b in value):
                return value.decode("ascii")
            return None
    return None


class TrafficState:
    """Requests in flight and whether the server drains: shared by the middleware, the routes (``/ready``) and
    the process that decides when to exit."""

    def __init__(self, retry_after: int = 5) -> None:
        self.in_flight = 0
        self.draining = False
        self.retry_after = retry_after


class Traffic:
    """ASGI middleware around the app: request ids, requests in flight, draining (``state``)."""

    def __init__(self, app, state: TrafficState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _given_id(scope.get("headers", [])) or uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            state = self.state
            if state.draining and scope.get("path") not in _ALWAYS_SERVED:
                await self._refuse(send_with_id)
                return
            state.in_flight += 1
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                state.in_flight -= 1
        finally:
            REQUEST_ID.reset(token)

    async def _refuse(self, send) -> None:
        body = {
            "error": {
                "message": "The server is shutting down; retry on another replica or later.",
                "type": "server_error",
                "param": None,
                "code": "shutting_down",
            }
        }
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", str(self.state.retry_after).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
