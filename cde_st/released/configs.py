"""The configs of a released CDE model: its backbone's transformers config (:func:`backbone_config`, with the
checks of :func:`check_backbone_config`) and the :class:`ContextualConfig` that reproduces the release
(:func:`module_config`)."""

from __future__ import annotations

import math
from typing import Any

from transformers import ModernBertConfig, NomicBertConfig

from cde_st.coercion import ConfigValueError, coerce
from cde_st.modules.contextual_config import ContextualConfig
from cde_st.released.hub import CONFIG_FILE, ReleasedCheckpointError

__all__ = ["BACKBONE_CONFIGS", "backbone_config", "backbone_from_raw", "check_backbone_config", "module_config"]

#: The soft prompt length is hard-coded in the released code.
_SOFT_PROMPT_TOKENS = 8


def backbone_config(raw: dict):
    """A transformers config for a released backbone from its ``config.json`` dict (``modernbert`` or
    ``nomic_bert``, including nomic's own GPT-2-style field names: ``n_embd``, ``n_layer``, ``n_inner``, ...)."""
    raw = {k: v for k, v in raw.items() if not k.startswith("_")}
    model_type = raw.get("model_type")
    if model_type == "modernbert":
        return ModernBertConfig.from_dict(raw)
    if model_type == "nomic_bert":
        if "n_embd" not in raw:
            return NomicBertConfig.from_dict(raw)
        return _nomic_config(raw)
    raise ReleasedCheckpointError(
        f"Backbone model_type {model_type!r} is not one of the released CDE backbones (modernbert, nomic_bert)."
    )


def _nomic_config(raw: dict) -> NomicBertConfig:
    """nomic-bert-2048's config (contrastors field names) -> ``transformers.NomicBertConfig``."""
    unsupported = {
        "rotary_emb_fraction": (raw.get("rotary_emb_fraction", 1.0), 1.0),
        "rotary_emb_interleaved": (raw.get("rotary_emb_interleaved", False), False),
        "prenorm": (raw.get("prenorm", False), False),
        "qkv_proj_bias": (raw.get("qkv_proj_bias", False), False),
        "mlp_fc1_bias": (raw.get("mlp_fc1_bias", False), False),
        "mlp_fc2_bias": (raw.get("mlp_fc2_bias", False), False),
        "activation_function": (raw.get("activation_function", "swiglu"), "swiglu"),
        "use_rms_norm": (raw.get("use_rms_norm", False), False),
        "parallel_block": (raw.get("parallel_block", False), False),
    }
    bad = {k: v for k, (v, want) in unsupported.items() if v != want and v is not None}
    if bad:
        raise ReleasedCheckpointError(f"NomicBERT settings not supported by transformers' NomicBertModel: {bad}.")
    multiple = raw.get("pad_vocab_size_multiple", 1) or 1

    def round_up(n: int, m: int) -> int:
        return (n + m - 1) // m * m

    return NomicBertConfig(
        vocab_size=round_up(raw["vocab_size"], multiple),
        hidden_size=raw["n_embd"],
        num_hidden_layers=raw["n_layer"],
        num_attention_heads=raw["n_head"],
        # nomic's gated MLP rounds its hidden features up to a multiple of 256
        intermediate_size=round_up(raw.get("n_inner") or 4 * raw["n_embd"], 256),
        hidden_act="silu",
        max_position_embeddings=raw.get("n_positions", 2048),
        type_vocab_size=raw.get("type_vocab_size", 2),
        layer_norm_eps=raw.get("layer_norm_epsilon", 1e-12),
        pad_token_id=raw.get("pad_token_id") or 0,
        rope_parameters={"rope_type": "default", "rope_theta": float(raw.get("rotary_emb_base", 10000))},
    )


# The released config.json fields cde_st reads: field -> (type, default when absent).
_CDE_FIELDS: dict[str, tuple[Any, Any]] = {
    "transductive_corpus_size": (int, None),
    "max_seq_length": (int, 512),
    "transductive_sequence_dropout_prob": (float, 0.0),
    "transductive_tokens_per_document": (int, 1),
    "autoregressive_backbone": (bool, False),
    "pooling_strategy": (str, "mean"),
    "embedding_output_dim": (int | None, None),
    "limit_layers": (int | None, None),
    "limit_layers_first_stage": (int | None, None),
    "transductive_tie_token_embeddings": (bool, False),
    "dataset_backbone": (str | None, None),
    "pool_ignore_contextual_tokens": (bool, True),
    "pool_ignore_instruction_tokens": (bool, False),
    "disable_transductive_rotary_embedding": (bool, False),
}


def _cde_fields(cde: dict, source: str) -> dict[str, Any]:
    """The released ``config.json`` fields by cde_st's one coercion rule (:mod:`cde_st.coercion`): a boolean must be
    true/false (``"false"`` would read as True), a count a whole number (8.7 is not 8), and a context size >= 1
    (0 would load the model as a bi-encoder). A :class:`ReleasedCheckpointError` names ``source`` and the field."""
    values = {}
    for field, (hint, default) in _CDE_FIELDS.items():
        if field not in cde and default is None and field == "transductive_corpus_size":
            raise ReleasedCheckpointError(f"{source}: field 'transductive_corpus_size' (the context size) is missing.")
        try:
            values[field] = coerce(cde.get(field, default), hint, field)
        except ConfigValueError as err:
            raise ReleasedCheckpointError(f"{source}: {err}.") from None
    rules = {
        "transductive_corpus_size": (values["transductive_corpus_size"] >= 1, "must be >= 1 (the context slots)"),
        "max_seq_length": (values["max_seq_length"] >= 1, "must be >= 1 (a token limit)"),
        "transductive_sequence_dropout_prob": (
            0.0 <= values["transductive_sequence_dropout_prob"] < 1.0,
            "must be in [0, 1)",
        ),
    }
    for field, (ok, rule) in rules.items():
        if not ok:
            raise ReleasedCheckpointError(f"{source}: field {field!r} = {values[field]!r}: {rule}.")
    return values


def module_config(cde: dict, model_type: str, source: str = CONFIG_FILE) -> ContextualConfig:
    """The :class:`ContextualConfig` reproducing a released model, from its ``config.json`` and backbone type.

    Raises :class:`ReleasedCheckpointError` naming ``source`` and the field for a value that would be misread
    (:func:`_cde_fields`) and for research-code options the releases do not use (and cde_st does not implement)."""
    # The residual head and the instruction rule arrived together with the pool_ignore_* fields (cde-small-v2).
    v2_code = "pool_ignore_instruction_tokens" in cde
    cde = {**cde, **_cde_fields(cde, source)}

    def require(field: str, ok: bool) -> None:
        if not ok:
            raise ReleasedCheckpointError(f"{source}: field {field}={cde.get(field)!r} is not supported.")

    require("transductive_tokens_per_document", cde.get("transductive_tokens_per_document", 1) == 1)
    require("autoregressive_backbone", not cde.get("autoregressive_backbone", False))
    require("pooling_strategy", cde.get("pooling_strategy", "mean") == "mean")
    require("embedding_output_dim", cde.get("embedding_output_dim") is None)
    require("limit_layers", cde.get("limit_layers") is None)
    require("limit_layers_first_stage", cde.get("limit_layers_first_stage") is None)
    require("transductive_tie_token_embeddings", not cde.get("transductive_tie_token_embeddings", False))
    require("dataset_backbone", cde.get("dataset_backbone") is None)
    require("pool_ignore_contextual_tokens", cde.get("pool_ignore_contextual_tokens", True))
    if model_type == "nomic_bert":
        # rotary excluded from the context rows (the research code's _shift_rotary_embedding, nomic models only)
        positions = "sequence_except_context" if cde.get("disable_transductive_rotary_embedding") else "sequence"
    else:
        positions = "sequence"
    return ContextualConfig(
        context_size=cde["transductive_corpus_size"],
        max_seq_length=cde["max_seq_length"],
        sequence_dropout=cde["transductive_sequence_dropout_prob"],
        include_prompt=True,
        first_stage_head="mlp",
        first_stage_residual=False,
        first_stage_norm=False,
        output_head="residual_mlp" if v2_code else "mlp",
        attn_implementation="sdpa",
        soft_prompt_tokens=_SOFT_PROMPT_TOKENS,
        prefix_positions=positions,
        embed_joint_sequence=True,
        local_attention_scope="sequence",
        pool_skip_instruction=": " if cde.get("pool_ignore_instruction_tokens") else None,
        context_padding="tile",
    )


def backbone_from_raw(raw: dict, source: str = "the backbone config") -> Any:
    """:func:`backbone_config`, with every failure a :class:`ReleasedCheckpointError` that names ``source``."""
    try:
        return backbone_config(raw)
    except ReleasedCheckpointError as err:
        raise ReleasedCheckpointError(f"{source}: {err}") from None
    except Exception as err:
        raise ReleasedCheckpointError(f"{source} could not be read as a backbone config: {err}") from err


# Backbone fields by type and rule (ModernBERT and NomicBERT field names): checked before transformers reads them,
# whose own errors do not name the file, and which takes some nonsense (a negative window) without a word.
def _positive(v: Any) -> bool:
    return v is not None and v > 0 and (not isinstance(v, float) or math.isfinite(v))


_BACKBONE_FIELDS: dict[str, tuple[Any, Any, str]] = {
    # name: (type, accepts(value), rule)
    "vocab_size": (int, _positive, "must be >= 1"),
    "hidden_size": (int, _positive, "must be >= 1"),
    "intermediate_size": (int, _positive, "must be >= 1"),
    "num_hidden_layers": (int, _positive, "must be >= 1"),
    "num_attention_heads": (int, _positive, "must be >= 1"),
    "max_position_embeddings": (int, _positive, "must be >= 1"),
    "local_attention": (int, _positive, "must be >= 1 (the sliding window, in tokens)"),
    "global_attn_every_n_layers": (int, _positive, "must be >= 1"),
    "norm_eps": (float, _positive, "must be a finite number > 0"),
    "global_rope_theta": (float, _positive, "must be a finite number > 0"),
    "local_rope_theta": (float, _positive, "must be a finite number > 0"),
    "n_embd": (int, _positive, "must be >= 1"),
    "n_head": (int, _positive, "must be >= 1"),
    "n_layer": (int, _positive, "must be >= 1"),
    "n_inner": (int | None, lambda v: v is None or v > 0, "must be >= 1 or null"),
    "n_positions": (int, _positive, "must be >= 1"),
    "pad_vocab_size_multiple": (int | None, lambda v: v is None or v > 0, "must be >= 1 or null"),
    "type_vocab_size": (int, _positive, "must be >= 1"),
    "layer_norm_epsilon": (float, _positive, "must be a finite number > 0"),
    "layer_norm_eps": (float, _positive, "must be a finite number > 0"),
    "rotary_emb_base": (float, _positive, "must be a finite number > 0"),
}

#: The public configs (model fields) of the released models' backbones, by the ``embedder`` their ``config.json``
#: names: what a given backbone config of the released sizes is checked against (:func:`check_backbone_config`), and
#: the real-size configs that can be built offline (``backbone_config(BACKBONE_CONFIGS[embedder])``).
BACKBONE_CONFIGS: dict[str, dict[str, Any]] = {
    "answerdotai/ModernBERT-base": {
        "model_type": "modernbert",
        "vocab_size": 50368,
        "hidden_size": 768,
        "intermediate_size": 1152,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "hidden_activation": "gelu",
        "max_position_embeddings": 8192,
        "norm_eps": 1e-05,
        "norm_bias": False,
        "pad_token_id": 50283,
        "eos_token_id": 50282,
        "bos_token_id": 50281,
        "cls_token_id": 50281,
        "sep_token_id": 50282,
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "local_attention": 128,
        "global_attn_every_n_layers": 3,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "nomic-ai/nomic-bert-2048": {
        "model_type": "nomic_bert",
        "activation_function": "swiglu",
        "n_embd": 768,
        "n_head": 12,
        "n_inner": 3072,
        "n_layer": 12,
        "n_positions": 2048,
        "vocab_size": 30528,
        "pad_vocab_size_multiple": 64,
        "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "prenorm": False,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
    },
}
# Of each released backbone: the fields that fix the tensor shapes (a config with other values there is another,
# e.g. smaller, backbone: a test fixture), and the architecture fields that do not change a shape, which a config
# of the released shapes must share (else the weights would load and compute another model).
_SHAPE_FIELDS = {
    "answerdotai/ModernBERT-base": ("hidden_size", "num_hidden_layers", "intermediate_size"),
    "nomic-ai/nomic-bert-2048": ("n_embd", "n_layer", "n_inner"),
}
_ARCHITECTURE_FIELDS = {
    "answerdotai/ModernBERT-base": (
        "num_attention_heads",
        "local_attention",
        "global_attn_every_n_layers",
        "global_rope_theta",
        "local_rope_theta",
        "norm_eps",
        "hidden_activation",
    ),
    "nomic-ai/nomic-bert-2048": ("n_head", "rotary_emb_base", "layer_norm_epsilon", "activation_function"),
}


def check_backbone_config(raw: dict, embedder: str, source: str) -> None:
    """A :class:`ReleasedCheckpointError` naming ``source`` and the field when the backbone config ``raw`` holds a
    value of the wrong type or range (by :mod:`cde_st.coercion`'s rule), a head count that does not divide the
    width, or, for a backbone with the sizes of the released ``embedder``, an architecture field (heads, window,
    rope theta, norm eps, ...) other than the embedder's: the weights would load and compute another model."""
    checked = {}
    for field, (hint, accepts, rule) in _BACKBONE_FIELDS.items():
        if field not in raw:
            continue
        try:
            value = coerce(raw[field], hint, field)
        except ConfigValueError as err:
            raise ReleasedCheckpointError(f"{source}: {err}.") from None
        if not accepts(value):
            raise ReleasedCheckpointError(f"{source}: field {field!r} = {raw[field]!r}: {rule}.")
        checked[field] = value
    for heads, width in (("num_attention_heads", "hidden_size"), ("n_head", "n_embd")):
        if heads in checked and width in checked and checked[width] % checked[heads]:
            raise ReleasedCheckpointError(
                f"{source}: field {heads!r} = {checked[heads]} does not divide {width} {checked[width]} (each head "
                "takes an equal share of the width)."
            )
    if embedder not in BACKBONE_CONFIGS:
        return
    public = BACKBONE_CONFIGS[embedder]
    if any(checked.get(k, raw.get(k)) != public[k] for k in _SHAPE_FIELDS[embedder]):
        return
    for field in _ARCHITECTURE_FIELDS[embedder]:
        expected = public[field]
        value = checked.get(field, raw.get(field, expected))
        if value != expected:
            raise ReleasedCheckpointError(
                f"{source}: field {field!r} = {raw.get(field)!r}, but the released weights were trained with "
                f"{embedder}'s {field} = {expected!r}; with the tensor shapes unchanged they would load and compute "
                f"another model. Use {embedder}'s own config (leave backbone_config out when online)."
            )
