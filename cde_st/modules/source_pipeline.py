"""The pretrained encoder a contextual model is built from (``from_encoder``): what its folder does around its
transformer (max length, pooling, normalisation), read from a local folder or a hub id; the recipe a new model
starts with (:data:`STARTS_AS_SOURCE`); and the two encoders and fields :func:`load_source_encoders` gives the
module's constructor."""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from sentence_transformers.sentence_transformer.modules import Pooling
from sentence_transformers.util import load_file_path
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cde_st.modules.contextual_config import position_limit
from cde_st.modules.encoders import load_pretrained_pair
from cde_st.modules.warning_location import caller_stacklevel

__all__ = [
    "STARTS_AS_SOURCE",
    "STARTS_AS_SOURCE_READING_LAYERS",
    "SourcePipeline",
    "check_encoder_location",
    "load_source_encoders",
    "read_source_pipeline",
    "starts_as_source_layers",
]

#: The recipe a model built by :meth:`ContextualTransformer.from_encoder` starts with unless told otherwise: an
#: untrained model that is exactly its source encoder whatever the context (cached context read through a
#: zero-initialised gate, no added heads). This is the one home of the recipe; the ``mini`` training preset
#: (``cde_st/training/presets/mini.yaml``) writes the same fields out so that a run's config records them, and
#: ``tests/training/test_config.py`` checks that the two agree. ContextualConfig's own defaults (joint attention,
#: heads) stay those of the paper, so folders saved without these fields load unchanged.
STARTS_AS_SOURCE: dict[str, Any] = {
    "context_attention": "cached",
    "context_gate": True,
    "output_head": "none",
    "first_stage_head": "none",
}
#: With :data:`STARTS_AS_SOURCE`, this many top second-stage layers read the context (MiniLM's 6: [3, 4, 5]).
STARTS_AS_SOURCE_READING_LAYERS = 3


def starts_as_source_layers(num_layers: int) -> list[int]:
    """The ``context_layers`` of :data:`STARTS_AS_SOURCE` for a second stage of ``num_layers`` layers."""
    return list(range(max(0, num_layers - STARTS_AS_SOURCE_READING_LAYERS), num_layers))


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


def load_source_encoders(
    name_or_path: str, fields: dict[str, Any], source: SourcePipeline | None = None
) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """The two encoders (independent copies of the pretrained one), its tokenizer, and the ``ContextualConfig``
    fields to build the module with: ``fields`` over :data:`STARTS_AS_SOURCE` (unless ``fields`` names
    ``context_attention`` or a released-compatibility field), and ``max_seq_length`` from the source folder where
    not given. ``source``: the :func:`read_source_pipeline` of ``name_or_path`` when the caller has already read it."""
    source = read_source_pipeline(name_or_path) if source is None else source
    start_as_source = "context_attention" not in fields and not (
        fields.get("embed_joint_sequence") or fields.get("prefix_positions", "none") != "none"
    )
    fields = {**STARTS_AS_SOURCE, **fields} if start_as_source else dict(fields)
    if source.pooling_mode != "mean":
        warnings.warn(
            f"{name_or_path!r} pools with {source.pooling_mode!r}; the contextual model mean-pools its second "
            "stage, so it does not start with that encoder's embeddings.",
            UserWarning,
            stacklevel=caller_stacklevel(),
        )
    first, second, tokenizer = load_pretrained_pair(source.model_dir, fields.get("attn_implementation", "auto"))
    if start_as_source and "context_layers" not in fields:
        fields["context_layers"] = starts_as_source_layers(second.config.num_hidden_layers)
    if "max_seq_length" not in fields:
        model_max = getattr(tokenizer, "model_max_length", 512) or 512
        limit = position_limit(second) or 512
        fields["max_seq_length"] = int(min(source.max_seq_length or model_max, model_max, 512, limit))
    return first, second, tokenizer, fields
