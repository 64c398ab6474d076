"""Errors in OpenAI's shape (cde_st/serving/errors.py): the type follows the status, as OpenAI's clients expect."""

from __future__ import annotations

from cde_st.serving.errors import ApiError


def test_the_body_is_openais_error_object():
    error = ApiError(400, "input is empty", param="input", code="empty_input")
    assert error.body() == {
        "error": {"message": "input is empty", "type": "invalid_request_error", "param": "input", "code": "empty_input"}
    }
    assert str(error) == "input is empty" and error.headers == {}


def test_the_type_follows_the_status_and_headers_travel():
    assert ApiError(401, "no key").type == "authentication_error"
    assert ApiError(429, "busy", headers={"Retry-After": "1"}).headers == {"Retry-After": "1"}
    assert ApiError(429, "busy").type == "rate_limit_error"
    assert ApiError(500, "boom").type == "server_error"
    assert ApiError(422, "odd").type == "invalid_request_error"
    assert ApiError(400, "x", type="custom").type == "custom"
