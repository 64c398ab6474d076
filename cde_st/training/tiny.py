"""The tiny smoke-test encoder of ``--preset tiny`` and of the tests: a randomly initialised 2-layer BERT with its own
generated WordPiece tokenizer, built in a second, offline, from nothing downloaded.

Its vocabulary holds BERT's special tokens, every printable ASCII character alone and as a ``##`` continuation, and
the words of the built-in tiny pairs and of the prompts: those texts tokenise into whole words, any other English
text into characters. ``TrainConfig`` model fields name it ``"tiny"`` (``base_model``, ``surrogate``, ``guide``).
"""

from __future__ import annotations

import json
import os
import re
import string

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from cde_st.atomic_files import write_folder_atomically
from cde_st.prompts import CLASSIFICATION_PROMPT, CLUSTERING_PROMPT, DOCUMENT_PROMPT, QUERY_PROMPT
from cde_st.training.pairs import tiny_pairs


def tiny_vocab() -> list[str]:
    """The WordPiece vocabulary of the tiny encoder: BERT's special tokens, every printable ASCII character (lower
    case) alone and as a ``##`` continuation, then the words of the built-in tiny pairs and of the prompts, so those
    texts tokenise into whole words and anything else into characters. Generated: nothing is downloaded."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    texts = [text for row in tiny_pairs() for text in (row["query"], row["document"])]
    texts += [QUERY_PROMPT, DOCUMENT_PROMPT, CLASSIFICATION_PROMPT, CLUSTERING_PROMPT]
    words = sorted({w for text in texts for w in re.findall(r"[a-z0-9]+", text.lower())} - set(chars))
    return specials + chars + ["##" + c for c in chars] + words


def build_tiny_tokenizer(path: str | os.PathLike) -> BertTokenizerFast:
    """A ``BertTokenizerFast`` (lower case) over :func:`tiny_vocab`, with its ``vocab.txt`` written to ``path``."""
    os.makedirs(path, exist_ok=True)
    vocab_file = os.path.join(path, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in tiny_vocab()))
    return BertTokenizerFast(vocab=vocab_file, do_lower_case=True)


def write_sentence_transformers_files(path: str | os.PathLike, hidden_size: int) -> None:
    """Make the HF folder at ``path`` a sentence-transformers model too: the transformer, then mean pooling (what
    ``SentenceTransformer`` builds around a plain HF folder), loaded without BERT's pooler.

    The encoder has no pooler (nothing reads it). Loaded as a plain HF folder, ``SentenceTransformer`` (the tiny
    surrogate and guide) asks ``AutoModel`` for one and transformers prints a LOAD REPORT of the missing
    ``pooler.dense`` weights, newly initialised, on every load. ``model_kwargs`` in ``sentence_bert_config.json``
    makes sentence-transformers load it as it was saved."""
    path = str(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.sentence_transformer.modules.Pooling",
        },
    ]
    files = {
        "modules.json": modules,
        "sentence_bert_config.json": {"model_kwargs": {"add_pooling_layer": False}},
        os.path.join("1_Pooling", "config.json"): {"embedding_dimension": hidden_size, "pooling_mode": "mean"},
    }
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    for name, content in files.items():
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)


def build_tiny_encoder(path: str | os.PathLike, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """Save a tiny randomly initialised BERT with its own generated WordPiece tokenizer to ``path`` (a Hugging Face
    model folder) and return ``path``: the base model of ``--preset tiny`` and of the tests, built offline without
    any downloaded model."""
    path = str(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = BertModel(config, add_pooling_layer=False)

    def write(staging):
        encoder.save_pretrained(staging)
        build_tiny_tokenizer(staging).save_pretrained(staging)
        write_sentence_transformers_files(staging, hidden_size)

    # Several processes of one launch (torchrun) may build it at once: same seed, same files.
    write_folder_atomically(path, write)
    return path
