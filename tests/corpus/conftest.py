"""Fixtures of the corpus tests: a small corpus in every format, a tiny contextual model and a tiny plain model."""

from __future__ import annotations

import json

import pytest

DOCS = [
    {
        "_id": f"d{i}",
        "title": f"topic {i % 5}",
        "text": f"document {i} says {'rain clouds' if i % 2 else 'sun'} {i % 7}",
    }
    for i in range(60)
]


def write_jsonl(path, records) -> str:
    """Write records (dicts, or raw str / bytes lines) as a JSON-lines file (gzip by suffix)."""
    import gzip

    lines = [r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in records]
    data = b"\n".join(lines) + b"\n"
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


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
