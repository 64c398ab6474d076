"""Errors as the OpenAI API reports them: a status code and ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

# OpenAI's ``type`` per status class; clients (the openai package) key their exception classes on the status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class ApiError(Exception):
    """An error answered to the client (never a traceback): status, message, the request field at fault (``param``)
    and a short machine-readable ``code``; ``headers`` go with the response (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
