"""Fixtures of the batching tests: a tiny SentenceTransformer, and a tiny BERT whose vocabulary holds the topic
words of :data:`batching_helpers.TOPICS`, with the static surrogate distilled from it once per session."""

from __future__ import annotations

import pytest
from batching_helpers import TOPICS

from cde_st.batching import distill_static_surrogate

# Words the static-surrogate tests tokenise whole (besides the topic words): see test_static_surrogate.py.
_WHOLE_WORDS = "a short query longer document about rockets and orbits snow question answer"


@pytest.fixture
def tiny_st_model(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=32)
    return SentenceTransformer(modules=[transformer, Pooling(32, "mean")], device="cpu")


@pytest.fixture(scope="session")
def topic_bert_dir(tmp_path_factory) -> str:
    """A tiny random BERT (hidden 32, 2 layers) with a WordPiece vocabulary of single characters plus the topic
    words, so that a static model distilled from it sees whole topic words (built here, nothing downloaded)."""
    import string

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("topic_bert")
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    words = sorted({w for text in [*TOPICS.values(), _WHOLE_WORDS] for w in text.split()} - set(chars))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *words]
    (folder / "vocab.txt").write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
    BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return str(folder)


@pytest.fixture
def topic_st_model(topic_bert_dir):
    """``topic_bert_dir`` as a mean-pooled SentenceTransformer: the teacher of the static surrogate."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    return SentenceTransformer(
        modules=[Transformer(topic_bert_dir, max_seq_length=32), Pooling(32, "mean")], device="cpu"
    )


@pytest.fixture(scope="session")
def static_root(tmp_path_factory, topic_bert_dir):
    """A $CDE_ST_CACHE holding the static surrogate distilled (once, seconds) from the tiny BERT."""
    pytest.importorskip("model2vec", reason="model2vec is not installed (pip install 'cde_st[fast-surrogate]')")
    root = tmp_path_factory.mktemp("cde_st_cache")
    distill_static_surrogate(topic_bert_dir, cache_dir=root / "surrogates")
    return root
