"""The routes' OpenAPI description as FastAPI renders it: each route's body, its success answer and each error status
in OpenAI's error shape with what causes it; an undescribed route is an error when the app is built."""

from __future__ import annotations

import pytest

fastapi = pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install -e '.[dev]')")

from cde_st.serving.openapi import ROUTE_DOCS, route_docs  # noqa: E402


@pytest.fixture(scope="module")
def spec() -> dict:
    """The description of an app with every described route (handlers that answer nothing)."""
    app = fastapi.FastAPI()
    for method, path in ROUTE_DOCS:
        app.add_api_route(path, lambda: None, methods=[method], **route_docs(method, path))
    return app.openapi()


def test_every_route_is_described_with_its_summary_and_statuses(spec):
    for (method, path), (_, responses, summary) in ROUTE_DOCS.items():
        described = spec["paths"][path.replace(":path", "")][method.lower()]
        assert described["summary"] == summary
        assert set(described["responses"]) == {str(status) for status in responses}


def test_errors_have_openais_shape_and_say_what_causes_them(spec):
    embeddings = spec["paths"]["/v1/embeddings"]["post"]["responses"]
    assert set(embeddings) == {"200", "400", "401", "404", "409", "413", "415", "429", "500", "503"}
    error = embeddings["429"]["content"]["application/json"]["schema"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["message", "type", "param", "code"]
    assert embeddings["429"]["description"] == "the queue is full (Retry-After)"
    assert spec["paths"]["/ready"]["get"]["responses"]["503"]["content"]["application/json"]["schema"] == error


def test_bodies_are_described_on_the_routes_that_take_one(spec):
    body = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] and schema["required"] == ["model", "input"]
    assert {"model", "input", "encoding_format", "dimensions", "input_type", "context", "truncate"} == set(
        schema["properties"]
    )
    context = spec["paths"]["/v1/contexts"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert context["required"] == ["name", "documents"]
    assert "requestBody" not in spec["paths"]["/v1/contexts"]["get"]
    assert route_docs("GET", "/health")["openapi_extra"] is None  # nothing to add for a route without a body


def test_an_undescribed_route_is_refused():
    with pytest.raises(KeyError, match="/v1/rerank"):
        route_docs("POST", "/v1/rerank")
