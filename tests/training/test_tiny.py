"""cde_st.training.tiny: the tiny encoder of --preset tiny and of the tests is built offline from nothing downloaded."""

from __future__ import annotations

import pytest

from cde_st.training import TrainConfig, train
from cde_st.training.tiny import build_tiny_encoder, build_tiny_tokenizer, tiny_vocab


def test_tiny_tokenizer_reads_its_own_words_whole_and_anything_else_as_characters(tmp_path):
    tokenizer = build_tiny_tokenizer(tmp_path)
    assert len(tokenizer) == len(tiny_vocab()) == len(set(tiny_vocab()))
    assert tokenizer.tokenize("search_query: Question 12 about rain") == [
        "search", "_", "query", ":", "question", "12", "about", "rain",
    ]  # fmt: skip
    assert tokenizer.tokenize("Zebra!") == ["z", "##e", "##b", "##r", "##a", "!"]
    assert tokenizer.unk_token not in tokenizer.tokenize("any ASCII text, 42 ~ {x}")


def test_tiny_encoder_is_deterministic_per_seed(tmp_path):
    def weights(path):
        return (tmp_path / path / "model.safetensors").read_bytes()

    build_tiny_encoder(tmp_path / "a", seed=0)
    build_tiny_encoder(tmp_path / "b", seed=0)
    build_tiny_encoder(tmp_path / "c", seed=1)
    assert weights("a") == weights("b") != weights("c")
    assert (tmp_path / "a" / "vocab.txt").read_text().split("\n")[:3] == ["[PAD]", "[UNK]", "[CLS]"]


@pytest.mark.slow
def test_tiny_preset_trains_without_minilm(tmp_path, monkeypatch):
    """`--preset tiny` after a plain `pip install` (no offline MiniLM extra, no hub): nothing asks for MiniLM."""
    import cde_st._defaults
    import cde_st.training.run

    def no_minilm(*args, **kwargs):
        raise AssertionError("the tiny preset asked for all-MiniLM-L6-v2")

    for module in (cde_st._defaults, cde_st.training.run):
        monkeypatch.setattr(module, "default_surrogate_model_path", no_minilm)
        monkeypatch.setattr(module, "load_default_surrogate", no_minilm)
    train(TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "run"), max_steps=2))
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
