"""Fixtures of the evaluation tests: a data folder with one tiny task per local format, a plain tiny bi-encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
from evaluation_helpers import make_classification, make_clustering, make_pairs, make_retrieval, make_sts


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for make in (make_retrieval, make_sts, make_classification, make_clustering, make_pairs):
        make(root)
    return root


@pytest.fixture(scope="session")
def tiny_plain_model(tiny_bert_dir):
    """A plain (non-contextual) sentence-transformers bi-encoder on the tiny random BERT."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension())])
    model.eval()
    return model
