"""Fixtures of the corpus tests: a small corpus in every format, a tiny contextual model and a tiny plain model."""

from __future__ import annotations

import pytest
from corpus_helpers import DOCS, write_jsonl


@pytest.fixture
def corpus_file(tmp_path) -> str:
    return write_jsonl(tmp_path / "corpus.jsonl", DOCS)


@pytest.fixture
def tiny_cde(make_tiny_cde):
    return make_tiny_cde(context_size=8)


@pytest.fixture
def tiny_plain(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    model = SentenceTransformer(modules=[Transformer(tiny_bert_dir), Pooling(32)])
    model.eval()
    return model
