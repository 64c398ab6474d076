"""What a pretrained encoder's folder does around its transformer (max length, pooling, normalisation), read from a
local folder or a hub id before a contextual model is built from it."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from sentence_transformers.sentence_transformer.modules import Pooling
from sentence_transformers.util import load_file_path


@dataclass(frozen=True)
class SourcePipeline:
    """What a pretrained encoder's sentence-transformers folder does after its transformer (plain HF encoders:
    nothing known, so mean pooling and no normalisation, as ``SentenceTransformer`` builds around them)."""

    model_dir: str  # the HF folder (or hub id) of the transformer
    max_seq_length: int | None = None  # the sentence-transformers limit, if the folder sets one
    pooling_mode: str | tuple = "mean"
    normalize: bool = False  # whether the source ends with a Normalize module (unit-length embeddings)


# A hub id: "owner/name", or a legacy id without an owner ("bert-base-uncased").
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")


def check_encoder_location(name_or_path: str) -> str:
    """``name_or_path`` (``~`` expanded) if it is a local folder or a hub id that can be had; otherwise a
    FileNotFoundError saying which it is not, instead of the hub's connection error. A string that looks like a path
    (``./``, ``/``, ``~``, an existing file, or not of the form ``owner/name`` or ``name``) must be an existing folder; a hub id
    must be downloadable, or in the Hugging Face cache when the hub is offline."""
    name = str(name_or_path)
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        return path
    where = os.path.abspath(path)
    if os.path.exists(path) or os.path.isabs(name) or name.startswith((".", "~")) or not _HUB_ID.fullmatch(name):
        kind = "is a file, not a folder" if os.path.exists(path) else "does not exist"
        raise FileNotFoundError(
            f"Encoder folder {name!r} {kind} (looked for {where}). Give a local folder holding a HF or "
            "sentence-transformers model, or a hub id ('owner/name' or a legacy 'name')."
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    if offline or hf_constants.HF_HUB_OFFLINE:
        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise FileNotFoundError(
                f"Encoder {name!r} is not a local folder (looked for {where}), and as a hub id it is not in the "
                "Hugging Face cache, which is all an offline hub (HF_HUB_OFFLINE=1) allows. Download it once "
                "online, or give the path of a local copy."
            )
    return name


def read_source_pipeline(name_or_path: str) -> SourcePipeline:
    """The transformer folder, max length, pooling and normalisation of a pretrained encoder (HF or
    sentence-transformers; local folder or hub id). The contextual model mean-pools its second stage, and
    :meth:`ContextualSentenceTransformer.from_encoder` ends with Normalize exactly when the source does, so a model
    built from a mean-pooling encoder starts with that encoder's embeddings, norms included."""
    name_or_path = check_encoder_location(name_or_path)
    modules_path = load_file_path(name_or_path, "modules.json")
    if modules_path is None:
        return SourcePipeline(name_or_path)
    with open(modules_path, encoding="utf-8") as f:
        modules = json.load(f)
    transformer = next((m for m in modules if m["type"].endswith("Transformer")), None)
    if transformer is None:
        raise ValueError(f"{name_or_path!r} is a sentence-transformers model without a Transformer module.")
    local = os.path.isdir(name_or_path)
    model_dir = os.path.join(name_or_path, transformer["path"]) if transformer["path"] and local else name_or_path
    max_len = _saved_max_seq_length(name_or_path, transformer["path"])
    pooling = next((m for m in modules if m["type"].endswith("Pooling")), None)
    mode = "mean" if pooling is None else Pooling.load_config(name_or_path, subfolder=pooling["path"])["pooling_mode"]
    if isinstance(mode, (list, tuple)):  # several modes are concatenated; one mode in a list is that mode
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    return SourcePipeline(model_dir, max_len, mode, normalize)


# transformers' "no limit" sentinel for model_max_length (int(1e30)): larger than any real limit.
_NO_LIMIT = 10**9


def _saved_max_seq_length(name_or_path: str, subfolder: str) -> int | None:
    """The length limit a sentence-transformers folder sets: ``sentence_bert_config.json``'s ``max_seq_length``
    (sentence-transformers < 6), else the tokenizer's ``model_max_length``, where sentence-transformers 6 saves it."""
    cfg_path = load_file_path(name_or_path, "sentence_bert_config.json", subfolder=subfolder)
    if cfg_path is not None:
        with open(cfg_path, encoding="utf-8") as f:
            max_len = json.load(f).get("max_seq_length")
        if max_len is not None:
            return max_len
    tok_path = load_file_path(name_or_path, "tokenizer_config.json", subfolder=subfolder)
    if tok_path is None:
        return None
    with open(tok_path, encoding="utf-8") as f:
        max_len = json.load(f).get("model_max_length")
    return max_len if isinstance(max_len, int) and max_len < _NO_LIMIT else None
