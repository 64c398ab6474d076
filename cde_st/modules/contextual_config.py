"""ContextualConfig: every architectural setting of a :class:`~cde_st.modules.ContextualTransformer`, with its
default and every rule about which values and combinations are valid.

The fields fall in two groups: (a) cde_st's own modes (context size, heads, how the text reads the context) and
(b) fields that exist only to reproduce the released cde-small-v1/v2 checkpoints (:mod:`cde_st.released` sets
them; their defaults keep cde_st's position-free design). :meth:`ContextualConfig.validate` (run on construction)
holds the rules that need nothing but the config; :meth:`ContextualConfig.for_encoders` the ones that need the two
encoders (position tables, layer count, rotary or not, attention kernel).

:meth:`ContextualConfig.to_dict` / :meth:`ContextualConfig.from_dict` are the settings part of ``cde_config.json``
(:func:`read_config_file` reads and checks the whole file). Every file older cde_st versions wrote still reads:
their ``query_prompt`` / ``document_prompt`` fields are returned apart (the model's prompts are stored in
``model.prompts``, see :mod:`cde_st.prompts`).

Example:
    >>> config = ContextualConfig(context_size=64, context_attention="cached", context_gate=True)
    >>> ContextualConfig.from_dict(config.to_dict()) == config
    True
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import PreTrainedModel

from cde_st.coercion import coerce
from cde_st.modules.backbone import get_adapter

CONFIG_FILE = "cde_config.json"
ENCODER_CONFIG_KEYS = ("first_stage_config", "second_stage_config")
#: Prompt fields of cde_config.json files written before ``model.prompts`` became the one stored copy.
LEGACY_PROMPT_KEYS = {"query_prompt": "query", "document_prompt": "document"}
#: What cde_config.json holds beside the settings: the two encoder configs and the active context's description.
FILE_SECTIONS = (*ENCODER_CONFIG_KEYS, "context_info")

FIRST_STAGE_HEADS = ("mlp", "none")
OUTPUT_HEADS = ("none", "mlp", "residual_mlp")
CONTEXT_ATTENTIONS = ("joint", "cached")
PREFIX_POSITIONS = ("none", "sequence", "sequence_except_context")
LOCAL_ATTENTION_SCOPES = ("text", "sequence")
CONTEXT_PADDINGS = ("null", "tile")
POOLINGS = ("mean", "weighted", "context")


@dataclass(frozen=True)
class ContextualConfig:
    """The settings of a two-stage contextual encoder (:class:`~cde_st.modules.ContextualTransformer`). Frozen and
    validated on construction (:meth:`validate`): change a field with ``dataclasses.replace``.

    cde_st's own modes:
        context_size: J, the number of context slots (paper: 512). Any J >= 0 works; fewer given vectors are
            padded with the learned null vector.
        max_seq_length: token limit of second-stage inputs.
        context_max_seq_length: token limit of first-stage (context) documents; None: ``max_seq_length``.
        sequence_dropout: probability that a context slot is replaced by the null vector while training (0.005).
        include_prompt: if False, prompt tokens are excluded from mean pooling.
        first_stage_head: "mlp" (Linear-GELU-Linear, as released CDE models) or "none" (needs equal widths).
        first_stage_residual: make the M1 head residual with a zero-initialised last layer (needs equal widths).
        first_stage_norm: end the M1 head with a LayerNorm initialised from M2's embedding LayerNorm, so context
            vectors live where M2's input embeddings live.
        output_head: "none", "mlp" (Linear-ReLU-Linear, cde-small-v1) or "residual_mlp" (cde-small-v2 style,
            zero-initialised so an untrained head is the identity).
        attn_implementation: "sdpa", "eager", "flash_attention_2", or "auto" (flash-attention 2 when installed
            (``pip install cde_st[flash]``) on a CUDA machine with a half-precision default dtype, else SDPA).
            The joint attention path runs with it; the split path always uses SDPA (see
            :mod:`cde_st.modules.context_attention`).
        context_attention: "joint" (the paper: context rows attend to the text too, so they are recomputed for
            every text) or "cached" (context rows attend only to context rows: their keys and values depend on the
            corpus alone, are computed once per context and reused, so a text costs about what the bi-encoder
            costs plus attention over J extra keys).
        context_gate: text rows read the context through a separate softmax scaled by tanh(g), one zero-initialised
            g per layer and head, added to their text-only attention. An untrained model is then exactly the
            encoder it was built from, whatever the context; training can only add what the context contributes.
        context_sink: with the gate, the context softmax gets one more key whose score is 0 and whose value is 0
            (an attention sink), so a text row that matches few context rows reads little and one that matches
            many reads much. Without it the read's weights always sum to one and say nothing of how many context
            documents match, which is what a word's weight in the corpus (its rarity) is made of.
        context_centering: the second stage reads the context vectors less their mean (each scaled back to the
            rows' mean norm): what sets each document apart from the rest of the corpus, not what all share.
        pooling: how the text's token states become one embedding: "mean" (the paper, the released models) or
            "weighted" (a learned weight per token from its state, zero-initialised so it starts as the mean). A
            corpus tells how common each word is; a mean can only add that to every token, a weight can make a
            common word count less. "context": a token's weight falls with how much its state shares with the
            mean of the context vectors (its word's frequency in the corpus; :class:`~cde_st.modules.heads.
            ContextWeightedPool`), learned from zero.
        context_layers: the second-stage layers whose text rows read the context (with "cached" or the gate);
            None: every layer. Others attend to the text alone. Fewer reading layers make a text cheaper (each
            read costs attention over J keys) and shrink the cache; the context rows still run through the layers
            below the last reading one. Negative indices count from the top (``[-3, -2, -1]``: the top three).

    Released-checkpoint compatibility (:mod:`cde_st.released` sets these for cde-small-v1/v2; the defaults keep
    cde_st's own position-free design):
        soft_prompt_tokens: learned prompt vectors between the context and the text (released: 8; ours: 0).
        prefix_positions: rotary positions of the prefix rows. "none" (ours): context and soft prompt get no
            rotation and the text counts from 0, so the context is a set. "sequence" (cde-small-v2): every row
            counts along the joint sequence, text from J + n_prompt. "sequence_except_context" (cde-small-v1 as
            NomicBERT applies rotary): like "sequence", but the J context rows get no rotation.
        embed_joint_sequence: run the backbone's input-embedding stage over the whole joint sequence after the
            text's own embedding, as the released code did (v2: the text is LayerNormed twice; v1: the text gets
            two token-type embeddings), so prefix rows get it once.
        local_attention_scope: sliding-window layers (ModernBERT): "text" (ours: the window applies among text
            tokens, the whole prefix stays visible) or "sequence" (cde-small-v2: the window runs over the joint
            sequence, so local layers see only the last prefix rows).
        pool_skip_instruction: a delimiter (cde-small-v2: ": "); mean pooling then skips every position up to and
            including the first token of ``tokenizer.encode(delimiter)`` after position 0 (the task instruction).
        context_padding: how fewer than J given vectors fill the slots: "null" (learned null vector) or "tile"
            (repeat them evenly, as the released models, which never saw null slots, expect).
    """

    # ---- (a) cde_st's own modes
    context_size: int = 512
    max_seq_length: int = 512
    context_max_seq_length: int | None = None
    sequence_dropout: float = 0.005
    include_prompt: bool = True
    first_stage_head: str = "mlp"
    first_stage_residual: bool = True
    first_stage_norm: bool = True
    output_head: str = "residual_mlp"
    attn_implementation: str | None = "auto"
    context_attention: str = "joint"
    context_gate: bool = False
    context_sink: bool = False
    context_centering: bool = False
    context_layers: list[int] | None = None
    pooling: str = "mean"

    # ---- (b) released-checkpoint compatibility (cde_st.released sets these for cde-small-v1/v2)
    soft_prompt_tokens: int = 0
    prefix_positions: str = "none"
    embed_joint_sequence: bool = False
    local_attention_scope: str = "text"
    pool_skip_instruction: str | None = None
    context_padding: str = "null"

    def __post_init__(self) -> None:
        # Every route (the constructor, dataclasses.replace, from_dict / cde_config.json, the released configs) gets
        # the one coercion rule of cde_st configs: a bool field takes only True/False ("false" would read as True),
        # an int field a whole number (8.7 is not silently 8); the error names the field.
        hints = _field_hints()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            coerced = coerce(value, hints[f.name], f.name, rule=_TYPE_RULES.get(f.name))
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)
        self.validate()

    # ------------------------------------------------------------------ rules
    @property
    def split_attention(self) -> bool:
        """Whether the text reads the context with cde_st's own split attention (cached context or gate)."""
        return self.context_attention == "cached" or self.context_gate

    def validate(self) -> None:
        """Every rule that needs only the config: each field's type and range, and which fields combine. A
        ValueError names the field and the value."""
        if self.context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {self.context_size}.")
        if not 0.0 <= self.sequence_dropout < 1.0:
            raise ValueError(f"sequence_dropout must be in [0, 1), got {self.sequence_dropout}.")
        if self.first_stage_head not in FIRST_STAGE_HEADS:
            raise ValueError(f"first_stage_head must be 'mlp' or 'none', got {self.first_stage_head!r}.")
        if self.output_head not in OUTPUT_HEADS:
            raise ValueError(f"output_head must be 'none', 'mlp' or 'residual_mlp', got {self.output_head!r}.")
        _check_choice("prefix_positions", self.prefix_positions, PREFIX_POSITIONS)
        _check_choice("local_attention_scope", self.local_attention_scope, LOCAL_ATTENTION_SCOPES)
        _check_choice("context_padding", self.context_padding, CONTEXT_PADDINGS)
        _check_choice("context_attention", self.context_attention, CONTEXT_ATTENTIONS)
        _check_choice("pooling", self.pooling, POOLINGS)
        if self.soft_prompt_tokens < 0:
            raise ValueError(f"soft_prompt_tokens must be >= 0, got {self.soft_prompt_tokens}.")
        check_seq_length("max_seq_length", self.max_seq_length)
        if self.context_max_seq_length is not None:
            check_seq_length("context_max_seq_length", self.context_max_seq_length)
        if self.split_attention and (self.embed_joint_sequence or self.prefix_positions != "none"):
            raise ValueError(
                "context_attention='cached' / context_gate are cde_st's own modes; they do not combine with the "
                "released-compatibility fields embed_joint_sequence / prefix_positions."
            )
        layers = self.context_layers
        if layers is not None and (
            isinstance(layers, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
        ):
            raise ValueError(f"context_layers must be a list of layer indices or None, got {layers!r}.")
        if self.context_sink and not self.context_gate:
            raise ValueError("context_sink needs context_gate=True: it is a key of the gated read's own softmax.")
        if layers is not None and not self.split_attention:
            raise ValueError(
                "context_layers needs context_attention='cached' or context_gate=True: in the paper's joint attention "
                "every layer attends over the whole sequence."
            )

    def for_encoders(self, first_stage: PreTrainedModel, second_stage: PreTrainedModel) -> ContextualConfig:
        """The rules that need the two encoders, and the config they resolve: token limits within the position
        tables (``context_max_seq_length`` filled in), ``context_layers`` as sorted non-negative indices, modes the
        second stage's family implements, equal widths where a head needs them, an attention kernel that can keep
        the masks these settings need."""
        max_seq_length = check_seq_length("max_seq_length", self.max_seq_length, second_stage)
        context_max = self.max_seq_length if self.context_max_seq_length is None else self.context_max_seq_length
        context_max = check_seq_length("context_max_seq_length", context_max, first_stage)
        config2 = second_stage.config
        adapter = get_adapter(config2.model_type)
        if self.prefix_positions != "none" and not adapter.rotary:
            raise ValueError(
                f"prefix_positions={self.prefix_positions!r} needs a rotary backbone; "
                f"{config2.model_type!r} adds absolute positions to the text only."
            )
        if self.split_attention and not adapter.split_attention:
            raise ValueError(
                f"context_attention='cached' and context_gate are not implemented for "
                f"{config2.model_type!r} backbones yet (BERT family, ModernBERT, NomicBERT)."
            )
        layers = _check_layers(self.context_layers, config2.num_hidden_layers)
        check_flash_attention(config2, self.local_attention_scope, self.split_attention)
        d1, d2 = first_stage.config.hidden_size, config2.hidden_size
        if self.first_stage_head == "none" and d1 != d2:
            raise ValueError(f"first_stage_head='none' needs equal widths; M1 has {d1}, M2 has {d2}.")
        return dataclasses.replace(
            self, max_seq_length=max_seq_length, context_max_seq_length=context_max, context_layers=layers
        )

    # ------------------------------------------------------------------ cde_config.json
    def to_dict(self) -> dict[str, Any]:
        """The settings as written to ``cde_config.json`` (JSON values)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextualConfig:
        """The settings of a ``cde_config.json`` dict, as any cde_st version wrote it: the file's other sections
        (encoder configs, ``context_info``) and its legacy prompt fields are skipped (see :func:`legacy_prompts`);
        an unknown field is a ValueError naming it."""
        fields = {
            key: value for key, value in data.items() if key not in FILE_SECTIONS and key not in LEGACY_PROMPT_KEYS
        }
        unknown = sorted(set(fields) - set(field_names()))
        if unknown:
            raise ValueError(f"unknown ContextualConfig field(s) {unknown}; known fields: {sorted(field_names())}.")
        return cls(**fields)


# What a field must be, beside its type, where a type error alone would not say it.
_TYPE_RULES = {
    "max_seq_length": "max_seq_length must be a positive integer (a token limit)",
    "context_max_seq_length": "context_max_seq_length must be a positive integer (a token limit) or None",
    "context_layers": "context_layers must be a list of layer indices or None",
}


def _field_hints() -> dict[str, Any]:
    global _HINTS
    if _HINTS is None:
        _HINTS = typing.get_type_hints(ContextualConfig)
    return _HINTS


_HINTS: dict[str, Any] | None = None


def field_names() -> tuple[str, ...]:
    """The names of the :class:`ContextualConfig` fields, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(ContextualConfig))


def legacy_prompts(data: dict[str, Any]) -> dict[str, str]:
    """The prompts a ``cde_config.json`` written by older cde_st holds, as ``query_prompt`` / ``document_prompt``
    keyword arguments of the module (empty for current files): they seed ``model.prompts`` where the folder's
    sentence-transformers config lacks them."""
    return {key: data[key] for key in LEGACY_PROMPT_KEYS if isinstance(data.get(key), str)}


def read_config_file(config_path: str) -> dict[str, Any]:
    """``cde_config.json`` as a dict, with every problem (not JSON, not an object, a missing encoder config,
    unknown fields) a ValueError naming the file and the field."""
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{config_path} is not valid JSON ({exc}): the file is truncated or corrupt. Save the model again."
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object (the module's settings), got {config!r:.80}.")
    for key in ENCODER_CONFIG_KEYS:
        if not isinstance(config.get(key), dict) or "model_type" not in config[key]:
            found = "missing" if key not in config else f"{config[key]!r:.80}"
            raise ValueError(
                f"{config_path}: {key!r} must be the encoder's config (an object with 'model_type'), "
                f"got {found}. The file is incomplete; save the model again."
            )
    known = {*field_names(), *LEGACY_PROMPT_KEYS, *FILE_SECTIONS}
    unknown = sorted(set(config) - known)
    if unknown:
        hints = [
            f"{key!r} (did you mean {match[0]!r}?)"
            if (match := difflib.get_close_matches(key, known, 1))
            else repr(key)
            for key in unknown
        ]
        raise ValueError(
            f"{config_path} has unknown field(s) {', '.join(hints)}; known fields: {sorted(known)}. "
            "A newer cde_st may have written it, or it was edited by hand."
        )
    return config


# ---------------------------------------------------------------------- single rules
def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def position_limit(encoder: PreTrainedModel) -> int | None:
    """Longest text an absolute-position encoder can embed (its position table), None for rotary backbones."""
    config = encoder.config
    if get_adapter(config.model_type).rotary or getattr(config, "max_position_embeddings", None) is None:
        return None
    # RoBERTa-style embeddings count positions from padding_idx + 1 (514 rows hold 512 positions).
    offset = getattr(getattr(encoder, "embeddings", None), "padding_idx", None)
    return config.max_position_embeddings - (offset + 1 if isinstance(offset, int) else 0)


def check_seq_length(name: str, value: Any, encoder: PreTrainedModel | None = None) -> int:
    """``value`` as a token limit: a positive int, at most the encoder's position table (when it has one)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer (a token limit; longer inputs are truncated), got {value!r}."
        )
    limit = None if encoder is None else position_limit(encoder)
    if limit is not None and value > limit:
        config = encoder.config
        raise ValueError(
            f"{name}={value} exceeds what the {config.model_type!r} encoder can embed: its position table has "
            f"max_position_embeddings={config.max_position_embeddings} ({limit} positions). Use {name} <= {limit}."
        )
    return int(value)


def check_flash_attention(config, local_attention_scope: str, split_attention: bool) -> None:
    """flash-attention takes no attention mask: a sliding-window layer would run its window over the joint
    sequence, silently dropping the rule of ``local_attention_scope="text"`` that every row sees the whole prefix."""
    if (
        getattr(config, "_attn_implementation", None) == "flash_attention_2"
        and "sliding_attention" in (getattr(config, "layer_types", None) or ())
        and local_attention_scope == "text"
        and not split_attention
    ):
        raise ValueError(
            f"attn_implementation='flash_attention_2' cannot keep the whole context visible to the sliding-window "
            f"layers of this {config.model_type!r} second stage (local_attention_scope='text'): use "
            "attn_implementation='sdpa', or local_attention_scope='sequence' (the released cde-small-v2 rule)."
        )


def _check_layers(layers: list[int] | None, num_layers: int) -> list[int] | None:
    """``context_layers`` as sorted non-negative indices (None: every layer), or a ValueError naming the problem."""
    if layers is None:
        return None
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if bad or not layers:
        raise ValueError(
            f"context_layers must name at least one of the second stage's {num_layers} layers "
            f"(0..{num_layers - 1}, or negative from the top), got {layers!r}."
        )
    return sorted({i % num_layers for i in layers})


def config_field(name: str, doc: str | None = None, checked_against: str | None = None) -> property:
    """Config field ``name`` of a module that holds a ``config`` (:class:`ContextualConfig`) as an attribute of the
    module: read-only; with ``doc``, settable (a value for a token limit is checked against the encoder the module
    holds under ``checked_against``). A set replaces the module's config, never edits it."""

    def get(self) -> Any:
        return getattr(self.config, name)

    def set_(self, value: Any) -> None:
        if checked_against is not None:
            value = check_seq_length(name, value, getattr(self, checked_against))
        self.config = dataclasses.replace(self.config, **{name: value})

    if doc is None:
        return property(get, doc=f"``config.{name}`` (see ContextualConfig).")
    return property(get, set_, doc=doc)
