"""Validating request bodies: every field checked once, each fault answered as a 400 naming the field (``param``),
as the OpenAI API does, before anything reaches the model."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cde_st.context import SEED_RULE, distinct_documents, is_seed
from cde_st.serving.errors import ApiError

INPUT_TYPES = ("query", "document")
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    texts: list[str]
    encoding_format: str
    dimensions: int | None
    input_type: str | None
    context: str | None
    truncate: bool | None = None  # None: the server's default
    single: bool = False  # input was one string (an error then names "input", not "input[0]")


@dataclass(frozen=True)
class ContextRequest:
    name: str
    documents: list[str]
    size: int | None
    seed: int
    replace: bool


def check_content_type(content_type: str | None) -> None:
    """415 unless the body is declared JSON (checked before a body is read)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            f"Content-Type must be application/json, got {content_type or 'none'!r}.",
            code="unsupported_media_type",
        )


def parse_json(raw: bytes, content_type: str | None) -> dict:
    """The JSON object of a body; 415 for another content type, 400 for malformed JSON or a non-object."""
    check_content_type(content_type)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "The request body nests JSON too deeply to be read.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"The request body must be a JSON object, got {type(body).__name__}.", code="invalid_json")
    return body


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text(text, param: str) -> str:
    if not isinstance(text, str):
        raise ApiError(400, f"{param} must be a string, got {type(text).__name__}.", param=param, code="invalid_type")
    if not text:
        raise ApiError(400, f"{param} is an empty string; give non-empty text.", param=param, code="empty_input")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{param} holds a lone surrogate, which is not valid text.", param=param) from None
    return text


def _texts(value, max_inputs: int) -> list[str]:
    """``input``: one string or a list of strings. Token-id input (a list of ints or of lists of ints), which OpenAI
    accepts, is refused: the server tokenises with the model's own tokenizer."""
    if isinstance(value, str):
        return [_check_text(value, "input")]
    if not isinstance(value, list):
        raise ApiError(
            400,
            f"input must be a string or a list of strings, got {type(value).__name__}.",
            param="input",
            code="invalid_type",
        )
    if not value:
        raise ApiError(400, "input is an empty list; give at least one text.", param="input", code="empty_input")
    if all(_is_int(v) for v in value) or all(isinstance(v, list) for v in value):
        raise ApiError(
            400,
            "Token-id input (arrays of integers) is not supported: send the texts as strings, the server tokenises "
            "them with the model's own tokenizer. (LangChain's OpenAIEmbeddings sends token ids unless it is built "
            "with check_embedding_ctx_length=False.)",
            param="input",
            code="token_ids_unsupported",
        )
    if len(value) > max_inputs:
        raise ApiError(
            400,
            f"input holds {len(value)} texts; at most {max_inputs} are accepted per request.",
            param="input",
            code="too_many_inputs",
        )
    return [_check_text(text, f"input[{i}]") for i, text in enumerate(value)]


def _optional_name(body: dict, field: str) -> str | None:
    value = body.get(field)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{field} must be a string, got {type(value).__name__}.", param=field, code="invalid_type")
    return value


def parse_embeddings(body: dict, max_inputs: int, dimension: int) -> EmbeddingsRequest:
    """An OpenAI embeddings body plus the ``input_type``, ``context`` and ``truncate`` extensions (other fields,
    e.g. ``user``, are accepted and ignored, as clients send them)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required: the served model's name (GET /v1/models).", param="model")
    if "input" not in body:
        raise ApiError(400, "input is required: a string or a list of strings.", param="input")
    texts = _texts(body["input"], max_inputs)
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise ApiError(
            400, f"encoding_format must be 'float' or 'base64', got {encoding_format!r}.", param="encoding_format"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _is_int(dimensions) or not 1 <= dimensions <= dimension):
        raise ApiError(
            400,
            f"dimensions must be an integer from 1 to {dimension} (the model's embedding size), got {dimensions!r}.",
            param="dimensions",
            code="invalid_dimensions",
        )
    input_type = _optional_name(body, "input_type")
    if input_type is not None and input_type not in INPUT_TYPES:
        raise ApiError(400, f"input_type must be 'query' or 'document', got {input_type!r}.", param="input_type")
    context = _optional_name(body, "context")
    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise ApiError(400, f"truncate must be true or false, got {truncate!r}.", param="truncate")
    single = isinstance(body["input"], str)
    return EmbeddingsRequest(model, texts, encoding_format, dimensions, input_type, context, truncate, single)


def parse_context(body: dict) -> ContextRequest:
    """``{"name", "documents", "size", "seed", "replace"}``; ``size`` (J) and ``seed`` are optional (the model's J,
    seed 0)."""
    name = body.get("name")
    if not isinstance(name, str):
        raise ApiError(400, "name is required: a string.", param="name")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents:
        raise ApiError(400, "documents is required: a non-empty list of strings.", param="documents")
    documents = [_check_text(text, f"documents[{i}]") for i, text in enumerate(documents)]
    if not distinct_documents(documents):  # the library's rule: blank documents are dropped from a context
        raise ApiError(
            400,
            "documents holds only blank documents (whitespace only): give at least one with text.",
            param="documents",
            code="empty_input",
        )
    size = body.get("size")
    if size is not None and (not _is_int(size) or size < 1):
        raise ApiError(400, f"size (J) must be a positive integer, got {size!r}.", param="size")
    seed = body.get("seed", 0)
    if not is_seed(seed):  # the library's one seed rule, so a seed the server takes is one set_context takes
        raise ApiError(400, f"seed {SEED_RULE}, got {seed!r}.", param="seed")
    replace = body.get("replace", False)
    if not isinstance(replace, bool):
        raise ApiError(400, f"replace must be true or false, got {replace!r}.", param="replace")
    return ContextRequest(name, documents, size, seed, replace)
