"""Request bodies (cde_st/serving/requests.py): every field checked once, each fault a 400 (415 for the content
type) naming the field, before anything reaches the model."""

from __future__ import annotations

import pytest

from cde_st.serving.errors import ApiError
from cde_st.serving.requests import check_content_type, parse_context, parse_embeddings, parse_json


def refused(call, status: int = 400, param: str | None = None, code: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == status
    if param is not None:
        assert caught.value.param == param
    if code is not None:
        assert caught.value.code == code
    return caught.value


def test_json_bodies_only():
    check_content_type("application/json; charset=utf-8")
    refused(lambda: check_content_type("text/plain"), 415, code="unsupported_media_type")
    refused(lambda: check_content_type(None), 415)
    assert parse_json(b'{"a": 1}', "application/json") == {"a": 1}
    refused(lambda: parse_json(b"{", "application/json"), code="invalid_json")
    refused(lambda: parse_json(b"[1]", "application/json"), code="invalid_json")


def test_an_embeddings_body_with_its_extensions():
    body = {"model": "m", "input": ["a", "b"], "dimensions": 4, "input_type": "query", "context": "c", "user": "u"}
    request = parse_embeddings(body, max_inputs=8, dimension=16)
    assert (request.texts, request.dimensions, request.input_type, request.context) == (["a", "b"], 4, "query", "c")
    assert request.encoding_format == "float"
    assert parse_embeddings({"model": "m", "input": "one"}, 8, 16).texts == ["one"]


@pytest.mark.parametrize(
    ("field", "value", "param", "code"),
    [
        ("input", [], "input", "empty_input"),
        ("input", "", "input", "empty_input"),
        ("input", ["a", 3], "input[1]", "invalid_type"),
        ("input", [1, 2, 3], "input", "token_ids_unsupported"),
        ("input", [[1, 2]], "input", "token_ids_unsupported"),
        ("input", ["a"] * 9, "input", "too_many_inputs"),
        ("input", ["\ud800"], "input[0]", None),
        ("dimensions", 0, "dimensions", "invalid_dimensions"),
        ("dimensions", 17, "dimensions", "invalid_dimensions"),
        ("dimensions", True, "dimensions", "invalid_dimensions"),
        ("encoding_format", "int8", "encoding_format", None),
        ("input_type", "passage", "input_type", None),
        ("context", 3, "context", "invalid_type"),
        ("model", "", "model", None),
    ],
)
def test_each_bad_embeddings_field_is_named(field, value, param, code):
    body = {"model": "m", "input": ["a"], field: value}
    refused(lambda: parse_embeddings(body, max_inputs=8, dimension=16), param=param, code=code)


def test_a_context_body():
    request = parse_context({"name": "wiki", "documents": ["a", "b"], "size": 2, "seed": 3, "replace": True})
    assert (request.name, request.documents, request.size, request.seed, request.replace) == (
        "wiki",
        ["a", "b"],
        2,
        3,
        True,
    )
    defaults = parse_context({"name": "wiki", "documents": ["a"]})
    assert (defaults.size, defaults.seed, defaults.replace) == (None, 0, False)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", None),
        ("documents", []),
        ("documents", "a"),
        ("documents", [" ", "\n\t"]),  # blank documents are dropped from a context: none would be left
        ("size", 0),
        ("size", 2.5),
        ("seed", -1),
        ("seed", 2**32),
        ("seed", True),
        ("replace", "yes"),
    ],
)
def test_each_bad_context_field_is_named(field, value):
    body = {"name": "wiki", "documents": ["a"], field: value}
    refused(lambda: parse_context(body), param=field)
