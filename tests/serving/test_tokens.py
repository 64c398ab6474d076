"""A request's tokens: texts within the model's limit are tokenised once (their count's ids, padded here), a
request with a longer text a second time with truncation, and both give exactly ``preprocess``'s features."""

from __future__ import annotations

import pytest
import torch
from sample_texts import SHORT_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st import ContextualSentenceTransformer
from cde_st.serving.tokens import RequestTokenizer


@pytest.fixture(scope="module")
def model(cde_dir):
    return ContextualSentenceTransformer(cde_dir)


@pytest.mark.parametrize(
    "texts",
    [["a"], ["a", "what causes rain?", "b c"], SHORT_DOCS[:3], ["a", " ".join(["word"] * 200)]],
    ids=["one", "within", "documents", "one-too-long"],
)
def test_features_are_what_preprocess_gives(model, texts, monkeypatch):
    prompt = model.prompts["query"]
    tokenizer = RequestTokenizer(model, MAX_SEQ_LENGTH, [prompt])
    assert tokenizer.exact
    second = []  # the second tokenising, with truncation
    encode = tokenizer._encode
    monkeypatch.setattr(tokenizer, "_encode", lambda *args: second.append(1) or encode(*args))
    tokens = tokenizer.tokenize(texts, prompt)
    expected = dict(model.preprocess(texts, prompt=prompt))
    for key, value in tokens.features.items():
        assert torch.equal(value, expected[key]) if isinstance(value, torch.Tensor) else value == expected[key]
    assert set(tokens.features) == set(expected)
    over = [len(model.tokenizer(prompt + t)["input_ids"]) > MAX_SEQ_LENGTH for t in texts]
    assert len(second) == (1 if any(over) else 0)  # a request within the limit is tokenised once
    assert tokens.truncated.tolist() == over
