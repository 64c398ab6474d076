"""Fixtures of the vector-store tests: a small corpus, tiny models and the folder cde-st-embed makes of it."""

from __future__ import annotations

import pytest
from store_helpers import DOCS, embed, write_corpus


@pytest.fixture
def tiny_cde(make_tiny_cde):
    return make_tiny_cde(context_size=8)


@pytest.fixture
def tiny_plain_model(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    model = SentenceTransformer(modules=[Transformer(tiny_bert_dir), Pooling(32)])
    model.eval()
    return model


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_corpus(tmp_path / "corpus.jsonl", DOCS)


@pytest.fixture
def embedded(tiny_cde, corpus, tmp_path) -> str:
    """The folder cde-st-embed writes for ``corpus`` with ``tiny_cde`` (a context of 8 sampled documents)."""
    return embed(tiny_cde, corpus, tmp_path / "corpus-emb")
