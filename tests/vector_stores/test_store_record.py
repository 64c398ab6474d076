"""The record a store keeps of the model and context its vectors were made with: made from a model (its own context
put back), carried as JSON with the context vectors bit for bit, and a record of another model, context or prompt
refused naming both values."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cde_st.context import fingerprint_array
from cde_st.fingerprints import model_fingerprint
from cde_st.vector_stores.store_record import (
    RECORD_FORMAT,
    ForeignStoreError,
    StoreRecord,
    decode_vectors,
    encode_vectors,
    query_prompt,
)

CONTEXT = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)


@pytest.fixture
def record() -> StoreRecord:
    return StoreRecord("tiny", "model-a", "context-a", "embedding-a", 32, "d: ", "q: ", normalized=True)


def test_vectors_survive_json_bit_for_bit():
    data = json.loads(json.dumps(encode_vectors(CONTEXT.astype(np.float64))))
    assert data["shape"] == [8, 32]
    decoded = decode_vectors(data)
    assert decoded.dtype == np.float32 and np.array_equal(decoded, CONTEXT)
    assert fingerprint_array(decoded) == fingerprint_array(CONTEXT)
    decoded[0, 0] = 1  # a copy, not a read-only view of the bytes
    assert decoded.flags.writeable


def test_a_contextual_models_record_and_its_own_context_put_back(tiny_cde):
    tiny_cde.set_context(["rain falls", "sun shines"])
    own = tiny_cde.contextual_module.context_vectors.clone()
    record = StoreRecord.of_model(tiny_cde, CONTEXT, "my-model", normalized=True, source="/data/emb")
    assert record.model_fingerprint == model_fingerprint(tiny_cde, with_context=False)
    assert record.context_fingerprint == fingerprint_array(CONTEXT) and record.embedding_fingerprint
    assert (record.model_name, record.dimension, record.normalized, record.source) == (
        "my-model",
        32,
        True,
        "/data/emb",
    )
    assert (record.document_prompt, record.query_prompt) == (tiny_cde.prompts["document"], tiny_cde.prompts["query"])
    assert np.array_equal(tiny_cde.contextual_module.context_vectors.numpy(), own.numpy())
    other = StoreRecord.of_model(tiny_cde, CONTEXT + 1, "my-model")
    assert other.embedding_fingerprint != record.embedding_fingerprint
    with pytest.raises(ValueError, match=r"a contextual model needs its context: give the \(J, d\) context vectors"):
        StoreRecord.of_model(tiny_cde, None, "my-model")


def test_a_plain_models_record_has_no_context(tiny_plain_model):
    record = StoreRecord.of_model(tiny_plain_model, None, "plain")
    assert (record.context_fingerprint, record.embedding_fingerprint, record.query_prompt) == (None, None, "")
    assert query_prompt(tiny_plain_model) == "" and record.describe().endswith("context fingerprint none")
    with pytest.raises(ValueError, match="SentenceTransformer is not a contextual model; it takes no context"):
        StoreRecord.of_model(tiny_plain_model, CONTEXT, "plain")


def test_a_record_reads_back_and_a_foreign_one_is_named(record):
    data = json.loads(record.to_json())
    assert data["format"] == RECORD_FORMAT and StoreRecord.from_dict(data, "store") == record
    old = {k: v for k, v in data.items() if k not in ("normalized", "source")}  # written before those fields
    assert StoreRecord.from_dict(old, "store") == dataclasses.replace(record, normalized=False)
    with pytest.raises(ForeignStoreError, match=r"table t holds no cde_st store record \(format 'other/1', want"):
        StoreRecord.from_dict({**data, "format": "other/1"}, "table t")
    with pytest.raises(ForeignStoreError, match=r"holds no cde_st store record \(format 'list'"):
        StoreRecord.from_dict([data], "table t")
    with pytest.raises(ForeignStoreError, match="table t: the cde_st store record lacks dimension, model_fingerprint"):
        StoreRecord.from_dict({k: v for k, v in data.items() if k not in ("dimension", "model_fingerprint")}, "table t")


@pytest.mark.parametrize(
    ("field", "what"),
    [
        ("model_fingerprint", "model fingerprint"),
        ("context_fingerprint", "context fingerprint"),
        ("embedding_fingerprint", r"embedding fingerprint \(weights, config and context\)"),
        ("dimension", "dimension"),
        ("document_prompt", "document prompt"),
        ("query_prompt", "query prompt"),
    ],
)
def test_another_model_context_or_prompt_is_refused_naming_both(record, field, what):
    record.check(dataclasses.replace(record, model_name="elsewhere", normalized=False), "t")  # names do not matter
    other = dataclasses.replace(record, **{field: 64 if field == "dimension" else "other"})
    mine, theirs = repr(getattr(record, field)), repr(getattr(other, field))
    with pytest.raises(ForeignStoreError, match=rf"t holds vectors made with {what} {mine}; the model given: {what} "
                                                 rf"{theirs}\. The store has: model tiny"):  # fmt: skip
        record.check(other, "t", given="the model given")


def test_context_vectors_are_checked_against_the_records_fingerprint(record):
    fitting = dataclasses.replace(record, context_fingerprint=fingerprint_array(CONTEXT))
    fitting.check_context(CONTEXT.copy(), "t", "the folder")
    with pytest.raises(ForeignStoreError, match=r"t records context fingerprint \w+; the folder has context finger"):
        fitting.check_context(CONTEXT + 1, "t", "the folder")
    with pytest.raises(ForeignStoreError, match="the folder has context fingerprint none"):
        fitting.check_context(None, "t", "the folder")
    dataclasses.replace(record, context_fingerprint=None).check_context(None, "t", "a plain model")
