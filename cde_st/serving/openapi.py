"""The OpenAPI description of the routes (served at ``/openapi.json``, browsable at ``/docs``).

The routes read their bodies themselves (so every fault is answered in OpenAI's error shape), which FastAPI cannot
see: the request bodies, the answers and the error statuses of each route are written here, per route, and given
to ``add_api_route`` as ``openapi_extra`` and ``responses``. They describe what :mod:`cde_st.serving.requests`
checks and :mod:`cde_st.serving.app` answers; ``tests/serving`` compares them with the real routes.
"""

from __future__ import annotations

__all__ = ["ROUTE_DOCS", "route_docs"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "examples": ["invalid_request_error"]},
                "param": {"type": ["string", "null"], "examples": ["input[3]"]},
                "code": {"type": ["string", "null"], "examples": ["context_length_exceeded"]},
            },
        }
    },
}
_TEXTS = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
_EMBEDDINGS_BODY = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "description": "the served model's name (GET /v1/models)"},
        "input": {**_TEXTS, "description": "a text or a list of texts (token ids are refused)"},
        "encoding_format": {"enum": ["float", "base64"], "default": "float"},
        "dimensions": {"type": "integer", "minimum": 1, "description": "keep the first d values (Matryoshka)"},
        "input_type": {"enum": ["query", "document"], "description": "the model's prompt of that name"},
        "context": {"type": "string", "description": "a context name (default: the model folder's context)"},
        "truncate": {
            "type": "boolean",
            "description": "embed the first max_seq_length tokens of a longer input (default: the server's "
            "--truncate; without it such an input is refused with 400 context_length_exceeded)",
        },
    },
}
_EMBEDDINGS_ANSWER = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
                },
            },
        },
        "model": {"type": "string"},
        "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {}}},
        "truncated_inputs": {"type": "integer", "description": "inputs longer than the model reads, cut"},
        "context": {"type": "object", "properties": {"name": {"type": "string"}, "fingerprint": {"type": "string"}}},
    },
}
_CONTEXT_BODY = {
    "type": "object",
    "required": ["name", "documents"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
        "documents": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "size": {"type": "integer", "minimum": 1, "description": "J, at most the model's context size"},
        "seed": {"type": "integer", "default": 0},
        "replace": {"type": "boolean", "default": False},
    },
}
_CONTEXT = {"type": "object", "description": "name, fingerprint, size, seed, corpus_size, created, ..."}
_STATUS = {"type": "object", "properties": {"status": {"type": "string"}, "model": {"type": "string"}}}
_WHY = {
    400: "a bad field, malformed or too deeply nested JSON, or an input longer than the model reads",
    401: "a missing or wrong API key",
    404: "an unknown model or context",
    409: "a context name that exists, is being created, or was made by another model or is damaged",
    413: "a body over --max-body-mb",
    415: "a content type other than application/json",
    429: "the queue is full (Retry-After)",
    500: "an internal error (the log has the traceback)",
    503: "draining after SIGTERM, or the batcher failed (Retry-After)",
}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(schema: dict) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _responses(ok: int, answer: dict, errors: tuple[int, ...]) -> dict:
    responses = {ok: _json(answer, "success")}
    responses.update({status: _json(_ERROR, _WHY[status]) for status in errors})
    return responses


#: Per route (method, path): (openapi_extra, responses, summary).
ROUTE_DOCS = {
    ("POST", "/v1/embeddings"): (
        _body(_EMBEDDINGS_BODY),
        _responses(200, _EMBEDDINGS_ANSWER, (400, 401, 404, 409, 413, 415, 429, 500, 503)),
        "Embed texts (OpenAI's body plus context, input_type and truncate)",
    ),
    ("POST", "/v1/contexts"): (
        _body(_CONTEXT_BODY),
        _responses(201, _CONTEXT, (400, 401, 409, 413, 415, 503)),
        "Create (or replace) a named context",
    ),
    ("GET", "/v1/contexts"): ({}, _responses(200, {"type": "object"}, (400, 401)), "List the contexts"),
    ("GET", "/v1/contexts/{name}"): ({}, _responses(200, _CONTEXT, (400, 401, 404, 409)), "Describe a context"),
    ("DELETE", "/v1/contexts/{name}"): ({}, _responses(200, _CONTEXT, (400, 401, 404, 409)), "Delete a context"),
    ("GET", "/v1/models"): ({}, _responses(200, {"type": "object"}, (401,)), "List the served model"),
    ("GET", "/v1/models/{model_id:path}"): ({}, _responses(200, {"type": "object"}, (401, 404)), "Describe the model"),
    ("GET", "/metrics"): ({}, {200: {"description": "Prometheus text"}}, "Prometheus metrics"),
    ("GET", "/health"): ({}, _responses(200, _STATUS, ()), "Liveness: 200 while the process serves"),
    ("GET", "/ready"): ({}, _responses(200, _STATUS, (503,)), "Readiness: 200 once warmed up, 503 while draining"),
}


def route_docs(method: str, path: str) -> dict:
    """``add_api_route`` keyword arguments describing one route. ``status_code`` is its success status: FastAPI
    documents that one (200 unless told) beside ``responses``, so a route answering 201 would list a 200 too."""
    extra, responses, summary = ROUTE_DOCS[(method, path)]
    return {"openapi_extra": extra or None, "responses": responses, "summary": summary, "status_code": min(responses)}
