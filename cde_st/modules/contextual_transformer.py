"""ContextualTransformer: the two-stage contextual document encoder as one sentence-transformers input module.

Stage 1 (M1, "dataset encoder") embeds J corpus documents into J context vectors:
    tokens -> M1 encoder -> mean pool -> MLP head                      (J, d2)
Stage 2 (M2) embeds a query or document *given* those vectors:
    [c_1 .. c_J ; e(t_1) .. e(t_L)] -> M2 encoder -> mean pool over t   (B, d2)
The context rows enter after the embedding layer, so they have no position: the context is a set. A learned null
vector fills empty slots (fewer than J documents, sequence dropout, or no context at all).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
import pickle
import re
import sys
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file, save_model
from sentence_transformers.base.modules import InputModule
from sentence_transformers.sentence_transformer.modules import Pooling
from sentence_transformers.util import load_file_path
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as transformers_logging

from cde_st.context import (
    ContextInfo,
    check_seed,
    fingerprint_array,
    fingerprint_texts,
    sample_context,
    sample_indices,
    validate_texts,
)
from cde_st.modules.backbone import NO_POSITION, get_adapter
from cde_st.modules.integrity import (
    META_TOKENIZER_SIZE,
    STAGES,
    check_finite,
    check_recorded_configs,
    check_state_dict,
    check_tokenizer,
    save_metadata,
    tokenizer_source,
)

logger = logging.getLogger(__name__)

CONTEXT_FILE = "context.safetensors"
DEFAULT_QUERY_PROMPT = "search_query: "
DEFAULT_DOCUMENT_PROMPT = "search_document: "
# What ContextualTransformer.from_encoder builds unless told otherwise: the `mini` training preset's recipe
# (cde_st/training.py; docs/RESULTS.md, issues 11-12), which starts as its source encoder. The constructor's own
# defaults (joint attention, heads) stay those of the paper, so folders saved without these fields load unchanged.
SOURCE_START: dict[str, Any] = {
    "context_attention": "cached",
    "context_gate": True,
    "output_head": "none",
    "first_stage_head": "none",
}
SOURCE_START_READING_LAYERS = 3  # the top 3 second-stage layers read the context (MiniLM: [3, 4, 5])


def _resolve_attn_implementation(name: str | None) -> str:
    """With "auto": flash-attention 2 when it is installed, a CUDA device is present and models are built in half
    precision (flash-attention has no fp32 kernels), else PyTorch SDPA. "flash_attention_2" asked for explicitly
    without the package or a CUDA device is an error naming what is missing, before any encoder is built."""
    if name in (None, "auto"):
        half = torch.get_default_dtype() in (torch.float16, torch.bfloat16)
        if half and torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
        return "sdpa"
    if name == "flash_attention_2":
        missing = []
        if importlib.util.find_spec("flash_attn") is None:
            missing.append("the flash-attn package (pip install 'cde_st[flash]', on a CUDA machine)")
        if not torch.cuda.is_available():
            missing.append("a CUDA device (torch.cuda.is_available() is False; flash-attention has no CPU kernels)")
        if missing:
            raise ImportError(
                f"attn_implementation='flash_attention_2' needs {' and '.join(missing)}. Use 'auto' (the default: "
                "flash-attention only where it can run) or 'sdpa'; when loading, model_kwargs={'attn_implementation': "
                "'sdpa'}."
            )
    return name


# Code between the user and a warning (cde_st itself, and the libraries that call its modules): a warning names the
# first frame outside these, the line that encoded or loaded.
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (
        os.path.dirname(__file__),  # cde_st/
        torch.__file__,
        importlib.util.find_spec("sentence_transformers").origin,
        importlib.util.find_spec("transformers").origin,
    )
)


def caller_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` in the function that calls this one: the first frame outside cde_st,
    torch, sentence-transformers and transformers (the user's line, however deep the library calls are)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def _position_limit(encoder: PreTrainedModel) -> int | None:
    """Longest text an absolute-position encoder can embed (its position table), None for rotary backbones."""
    config = encoder.config
    if get_adapter(config.model_type).rotary or getattr(config, "max_position_embeddings", None) is None:
        return None
    # RoBERTa-style embeddings count positions from padding_idx + 1 (514 rows hold 512 positions).
    offset = getattr(getattr(encoder, "embeddings", None), "padding_idx", None)
    return config.max_position_embeddings - (offset + 1 if isinstance(offset, int) else 0)


def _check_seq_length(name: str, value: Any, encoder: PreTrainedModel | None) -> int:
    """``value`` as a token limit: a positive int, at most the encoder's position table (when it has one)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer (a token limit; longer inputs are truncated), got {value!r}."
        )
    limit = None if encoder is None else _position_limit(encoder)
    if limit is not None and value > limit:
        config = encoder.config
        raise ValueError(
            f"{name}={value} exceeds what the {config.model_type!r} encoder can embed: its position table has "
            f"max_position_embeddings={config.max_position_embeddings} ({limit} positions). Use {name} <= {limit}."
        )
    return int(value)


def check_backend(backend: str) -> None:
    """Contextual models run on PyTorch only: the context hook (set_context, dataset_embeddings) has no ONNX or
    OpenVINO export."""
    if backend != "torch":
        raise ValueError(
            f"backend={backend!r} is not supported for contextual (cde_st) models: there is no ONNX/OpenVINO export "
            "of the two-stage model and its context. Load it with backend='torch' (the default)."
        )


def _resolve_dtype(value: Any, encoder_config: dict) -> torch.dtype | None:
    """``model_kwargs`` dtype (a torch dtype, its name, or "auto": the dtype the encoders were saved in) -> dtype."""
    if value == "auto":
        value = encoder_config.get("dtype") or encoder_config.get("torch_dtype")
    if value is None:
        return None
    dtype = getattr(torch, value.removeprefix("torch."), None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"model_kwargs dtype={value!r} is not a floating-point torch dtype "
            "(e.g. torch.float32, torch.bfloat16, 'float16' or 'auto')."
        )
    return dtype


def split_model_kwargs(
    model_kwargs: dict[str, Any] | None, loader: str, stacklevel: int = 3, **kwargs
) -> tuple[Any, str | None]:
    """The loading options a contextual model applies: ``model_kwargs`` ``dtype`` (or ``torch_dtype``) and
    ``attn_implementation``, as ``(dtype, attn_implementation)`` (None: not given). Every other ``model_kwargs``
    key, and a non-empty ``config_kwargs`` / ``processor_kwargs`` in ``kwargs``, is ignored with a warning that
    names it and ``loader``."""
    model_kwargs = dict(model_kwargs or {})
    dtype = model_kwargs.pop("dtype", None)
    torch_dtype = model_kwargs.pop("torch_dtype", None)
    dtype = dtype if dtype is not None else torch_dtype
    attn_implementation = model_kwargs.pop("attn_implementation", None)
    ignored = [f"model_kwargs[{key!r}]" for key in sorted(model_kwargs)]
    ignored += [name for name in ("config_kwargs", "processor_kwargs") if kwargs.get(name)]
    if ignored:
        warnings.warn(
            f"{loader} ignores {', '.join(ignored)}: of model_kwargs it applies only 'dtype' "
            "(or 'torch_dtype') and 'attn_implementation'.",
            UserWarning,
            stacklevel=stacklevel,
        )
    return dtype, attn_implementation


def _corrupt_file_error(path: str | None, exc: Exception) -> ValueError:
    return ValueError(
        f"{path} is corrupt or truncated and cannot be read ({type(exc).__name__}: {exc}). Copy or save the model "
        "again (an interrupted download or copy leaves a partial file)."
    )


@torch.no_grad()
def _values_fingerprint(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A fingerprint of the *values* of ``tensors``: the sum of every row (last dimension), concatenated, float32.

    One read of the values, so it sees every way a weight can change (optimizer steps, fused ones included, which
    do not bump version counters; ``param.data = ...``; in-place edits through ``.data``; ``load_state_dict``):
    any change of an element larger than the rounding of its row's sum, and any move of values between rows.
    Kept on the CPU, so fingerprints taken before and after ``model.to(device)`` compare. Compare with
    ``torch.equal``."""
    rows = [t.detach().flatten(0, -2) if t.ndim > 1 else t.detach().reshape(1, -1) for t in tensors]
    sums = [r.sum(-1, dtype=torch.float32) for r in rows]

    return torch.cat(sums).cpu() if sums else torch.zeros(0)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, d), (B, L) -> (B, d): mean over positions where mask is 1 (zero vector if none)."""
    mask = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


class _Head(nn.Module):
    """Linear -> activation -> Linear, optionally residual. With ``residual`` the last layer starts at zero,
    so an untrained head is the identity and a model built from a pretrained encoder starts as that encoder."""

    def __init__(self, d_in: int, d_out: int, activation: str, residual: bool):
        super().__init__()
        if residual and d_in != d_out:
            raise ValueError(f"A residual head needs equal input and output widths, got {d_in} -> {d_out}.")
        self.residual = residual
        self.fc1 = nn.Linear(d_in, d_out)
        self.act = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.fc2 = nn.Linear(d_out, d_out)
        if residual:
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(self.act(self.fc1(x)))
        return x + out if self.residual else out


def _build_encoder(config: dict | Any, attn_implementation: str | None) -> PreTrainedModel:
    if isinstance(config, dict):
        config = dict(config)
        config = AutoConfig.for_model(config.pop("model_type"), **config)
    return AutoModel.from_config(
        config,
        attn_implementation=_resolve_attn_implementation(attn_implementation),
        **get_adapter(config.model_type).model_kwargs,
    )


def _check_flash_attention(config, local_attention_scope: str, split_attention: bool) -> None:
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
    if isinstance(layers, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise ValueError(f"context_layers must be a list of layer indices or None, got {layers!r}.")
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if bad or not layers:
        raise ValueError(
            f"context_layers must name at least one of the second stage's {num_layers} layers "
            f"(0..{num_layers - 1}, or negative from the top), got {layers!r}."
        )
    return sorted({i % num_layers for i in layers})


class _SoftPrompt(nn.Module):
    """``n`` learned prompt vectors between the context and the text: ``projection(ones(d))`` reshaped to (n, d),
    with projection = Linear(d, d) -> ReLU -> Linear(d, n * d), as in the released CDE models."""

    def __init__(self, d: int, n: int):
        super().__init__()
        self.n = n
        self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, n * d))

    def forward(self) -> torch.Tensor:
        weight = self.projection[0].weight
        return self.projection(weight.new_ones(weight.shape[1])).view(self.n, -1)  # (n, d)


class ContextualTransformer(InputModule):
    """Two-stage contextual encoder (CDE, Morris & Rush, ICLR 2025) as a sentence-transformers input module.

    Args:
        first_stage: M1, a HF encoder (or its config dict). Embeds context documents.
        second_stage: M2, a HF encoder (or its config dict). Embeds queries/documents with context prepended.
        tokenizer: tokenizer shared by both stages.
        context_size: J, the number of context slots (paper: 512). Any J >= 0 works; fewer given vectors are
            padded with the learned null vector.
        max_seq_length: token limit of second-stage inputs.
        context_max_seq_length: token limit of first-stage (context) documents; defaults to ``max_seq_length``.
        sequence_dropout: probability that a context slot is replaced by the null vector while training (0.005).
        include_prompt: if False, prompt tokens are excluded from mean pooling.
        first_stage_head: "mlp" (Linear-GELU-Linear, as released CDE models) or "none" (needs equal widths).
        first_stage_residual: make the M1 head residual with a zero-initialised last layer (needs equal widths).
        first_stage_norm: end the M1 head with a LayerNorm initialised from M2's embedding LayerNorm, so context
            vectors live where M2's input embeddings live.
        output_head: "none", "mlp" (Linear-ReLU-Linear, cde-small-v1) or "residual_mlp" (cde-small-v2 style,
            zero-initialised so an untrained head is the identity).
        query_prompt / document_prompt: task prefixes; context documents always get the document prompt.
        attn_implementation: "sdpa", "eager", "flash_attention_2", or "auto" (flash-attention 2 when installed
            (``pip install cde_st[flash]``) on a CUDA machine with a half-precision default dtype, else SDPA).

    Attention between text and context (cde_st's own models; the released checkpoints use "joint", no gate):
        context_attention: "joint" (the paper: context rows attend to the text too, so they are recomputed for
            every text) or "cached" (context rows attend only to context rows: their keys and values depend on the
            corpus alone, are computed once per context and reused, so a text costs about what the bi-encoder
            costs plus attention over J extra keys).
        context_gate: text rows read the context through a separate softmax scaled by tanh(g), one zero-initialised
            g per layer and head, added to their text-only attention. An untrained model is then exactly the
            encoder it was built from, whatever the context; training can only add what the context contributes.
        context_layers: the second-stage layers whose text rows read the context (with "cached" or the gate);
            None: every layer. Others attend to the text alone. Fewer reading layers make a text cheaper (each
            read costs attention over J keys) and shrink the cache; the context rows still run through the layers
            below the last reading one. Negative indices count from the top (``[-3, -2, -1]``: the top three).

    Released-checkpoint compatibility (``cde_st.released`` sets these for cde-small-v1/v2; the defaults keep
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

    Example:
        >>> from cde_st import ContextualSentenceTransformer
        >>> model = ContextualSentenceTransformer.from_encoder("sentence-transformers/all-MiniLM-L6-v2", context_size=64)
        >>> model.set_context(corpus_texts, seed=0)                       # doctest: +SKIP
        >>> model.encode_query(["what causes rain?"]).shape               # doctest: +SKIP
        (1, 384)
    """

    config_file_name = "cde_config.json"
    config_keys = [
        "context_size",
        "max_seq_length",
        "context_max_seq_length",
        "sequence_dropout",
        "include_prompt",
        "first_stage_head",
        "first_stage_residual",
        "first_stage_norm",
        "output_head",
        "query_prompt",
        "document_prompt",
        "attn_implementation",
        "soft_prompt_tokens",
        "prefix_positions",
        "embed_joint_sequence",
        "local_attention_scope",
        "pool_skip_instruction",
        "context_padding",
        "context_attention",
        "context_gate",
        "context_layers",
    ]
    forward_kwargs = {"dataset_embeddings", "context_mask"}

    def __init__(
        self,
        first_stage: PreTrainedModel | dict,
        second_stage: PreTrainedModel | dict,
        tokenizer,
        context_size: int = 512,
        max_seq_length: int = 512,
        context_max_seq_length: int | None = None,
        sequence_dropout: float = 0.005,
        include_prompt: bool = True,
        first_stage_head: str = "mlp",
        first_stage_residual: bool = True,
        first_stage_norm: bool = True,
        output_head: str = "residual_mlp",
        query_prompt: str = DEFAULT_QUERY_PROMPT,
        document_prompt: str = DEFAULT_DOCUMENT_PROMPT,
        attn_implementation: str | None = "auto",
        soft_prompt_tokens: int = 0,
        prefix_positions: str = "none",
        embed_joint_sequence: bool = False,
        local_attention_scope: str = "text",
        pool_skip_instruction: str | None = None,
        context_padding: str = "null",
        context_attention: str = "joint",
        context_gate: bool = False,
        context_layers: list[int] | None = None,
    ) -> None:
        super().__init__()
        if context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {context_size}.")
        if not 0.0 <= sequence_dropout < 1.0:
            raise ValueError(f"sequence_dropout must be in [0, 1), got {sequence_dropout}.")
        if first_stage_head not in ("mlp", "none"):
            raise ValueError(f"first_stage_head must be 'mlp' or 'none', got {first_stage_head!r}.")
        if output_head not in ("none", "mlp", "residual_mlp"):
            raise ValueError(f"output_head must be 'none', 'mlp' or 'residual_mlp', got {output_head!r}.")
        _check_choice("prefix_positions", prefix_positions, ("none", "sequence", "sequence_except_context"))
        _check_choice("local_attention_scope", local_attention_scope, ("text", "sequence"))
        _check_choice("context_padding", context_padding, ("null", "tile"))
        _check_choice("context_attention", context_attention, ("joint", "cached"))
        if soft_prompt_tokens < 0:
            raise ValueError(f"soft_prompt_tokens must be >= 0, got {soft_prompt_tokens}.")
        self.context_size = context_size
        self.sequence_dropout = sequence_dropout
        self.include_prompt = include_prompt
        self.first_stage_head = first_stage_head
        self.first_stage_residual = first_stage_residual
        self.first_stage_norm = first_stage_norm
        self.output_head = output_head
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.attn_implementation = attn_implementation
        self.soft_prompt_tokens = soft_prompt_tokens
        self.prefix_positions = prefix_positions
        self.embed_joint_sequence = embed_joint_sequence
        self.local_attention_scope = local_attention_scope
        self.pool_skip_instruction = pool_skip_instruction
        self.context_padding = context_padding
        self.context_attention = context_attention
        self.context_gate = context_gate

        self.tokenizer = tokenizer
        self.first_stage = (
            first_stage
            if isinstance(first_stage, PreTrainedModel)
            else _build_encoder(first_stage, attn_implementation)
        )
        self.second_stage = (
            second_stage
            if isinstance(second_stage, PreTrainedModel)
            else _build_encoder(second_stage, attn_implementation)
        )
        # Validated (positive, within the position table) now that the encoders exist; again on every later set.
        self.max_seq_length = max_seq_length
        self.context_max_seq_length = max_seq_length if context_max_seq_length is None else context_max_seq_length
        self.first_adapter = get_adapter(self.first_stage.config.model_type)
        self.second_adapter = get_adapter(self.second_stage.config.model_type)
        if prefix_positions != "none" and not self.second_adapter.rotary:
            raise ValueError(
                f"prefix_positions={prefix_positions!r} needs a rotary backbone; "
                f"{self.second_stage.config.model_type!r} adds absolute positions to the text only."
            )
        if self._split_attention:
            if not self.second_adapter.split_attention:
                raise ValueError(
                    f"context_attention='cached' and context_gate are not implemented for "
                    f"{self.second_stage.config.model_type!r} backbones yet (BERT family, ModernBERT, NomicBERT)."
                )
            if embed_joint_sequence or prefix_positions != "none":
                raise ValueError(
                    "context_attention='cached' / context_gate are cde_st's own modes; they do not combine with the "
                    "released-compatibility fields embed_joint_sequence / prefix_positions."
                )
        self.context_layers = _check_layers(context_layers, self.second_stage.config.num_hidden_layers)
        _check_flash_attention(self.second_stage.config, local_attention_scope, self._split_attention)
        if self.context_layers is not None and not self._split_attention:
            raise ValueError(
                "context_layers needs context_attention='cached' or context_gate=True: in the paper's joint attention "
                "every layer attends over the whole sequence."
            )
        self._instruction_token_id = None
        if pool_skip_instruction is not None:
            ids = tokenizer.encode(pool_skip_instruction, add_special_tokens=False)
            if not ids:
                raise ValueError(f"pool_skip_instruction={pool_skip_instruction!r} tokenises to nothing.")
            self._instruction_token_id = ids[0]
        d1, d2 = self.first_stage.config.hidden_size, self.second_stage.config.hidden_size

        if first_stage_head == "mlp":
            head = _Head(d1, d2, "gelu", residual=first_stage_residual and d1 == d2)
        elif d1 != d2:
            raise ValueError(f"first_stage_head='none' needs equal widths; M1 has {d1}, M2 has {d2}.")
        else:
            head = nn.Identity()
        if first_stage_norm:
            # Context rows replace token embeddings at M2's input: normalise them like M2's embedding layer does
            # (initialised from it), so a model built from a pretrained encoder starts close to in-distribution.
            source = self.second_adapter.input_norm(self.second_stage)
            if source is not None:
                norm = nn.LayerNorm(d2, eps=source.eps, bias=source.bias is not None)
                norm.load_state_dict(source.state_dict())
            else:
                norm = nn.LayerNorm(d2, eps=getattr(self.second_stage.config, "layer_norm_eps", 1e-12))
            head = nn.Sequential(head, norm)
        self.context_head = head
        # The null slot starts as M2's own [PAD] embedding, which pretrained encoders learn to attend past.
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        with torch.no_grad():
            pad = self.second_adapter.embed_tokens(self.second_stage, torch.tensor([[pad_id]]), None)[0, 0]
        self.null_vector = nn.Parameter(pad.detach().clone())
        self.soft_prompt = _SoftPrompt(d2, soft_prompt_tokens) if soft_prompt_tokens else None
        config2 = self.second_stage.config
        self.gates = (
            nn.Parameter(torch.zeros(config2.num_hidden_layers, config2.num_attention_heads)) if context_gate else None
        )
        # Cached mode, inference: (prefix rows, fingerprint of the second stage, per-layer keys/values). Reused only
        # for an equal prefix and (checked once per encode call, see _check_weights) unchanged second-stage weights.
        self._context_cache: tuple[torch.Tensor, torch.Tensor, list] | None = None
        self._register_load_state_dict_pre_hook(self._drop_context_cache)  # new weights: the cache is stale
        if output_head == "none":
            self.head = nn.Identity()
        else:
            self.head = _Head(d2, d2, "relu", residual=output_head == "residual_mlp")

        # The active context: (J', d2) first-stage vectors, J' <= context_size. Not a parameter and not in the
        # weights file (its size varies); saved beside it as context.safetensors.
        self.register_buffer("context_vectors", None, persistent=False)
        self.context_info: ContextInfo | None = None
        # Bumped in place whenever the active context changes; moved to shared memory when the module is pickled
        # (a multi-process pool's workers get such a copy), so a worker can tell that its copy went stale.
        self._context_generation = torch.zeros(1, dtype=torch.long)
        self._context_generation_seen = 0
        self._warned_null_context = False
        self._context_texts: list[str] | None = None  # the prompted documents of the active context, if texts
        # Fingerprint (_values_fingerprint) of the first-stage weights the active context vectors were embedded with,
        # and the token ids of its documents (only their rows of the embedding table feed the vectors).
        self._context_weights: torch.Tensor | None = None
        self._context_token_ids: torch.Tensor | None = None
        self._weights_check_due = True  # set by eval() (once per encode call): compare fingerprints before use
        self._weights_key: tuple | None = None  # (parameters, their (storage, version)) at the last check

        self._warned_stale_context = False

        self._prompt_length_cache: dict[str, int] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_encoder(cls, name_or_path: str, source: SourcePipeline | None = None, **config) -> ContextualTransformer:
        """Build M1 and M2 from the same pretrained encoder (a HF model id/folder or a sentence-transformers folder).

        Weights are copied into two independent encoders (not shared), as in the paper. For a
        sentence-transformers folder the Transformer module's subfolder and ``max_seq_length`` are used.
        ``source``: the :func:`read_source_pipeline` of ``name_or_path`` when the caller has already read it.

        Unless ``config`` names ``context_attention`` (or a released-compatibility field), the model starts as its
        source: the recipe of the ``mini`` training preset (:data:`SOURCE_START`: cached context read through a
        zero-initialised gate by the top three second-stage layers, no added heads), so untrained it gives the
        encoder's embeddings whatever the context. ``context_attention="joint"`` gives the paper's joint attention
        with the constructor's defaults (an untrained model then mixes the context into every text: issue 23).
        Any field given in ``config`` wins over these defaults.
        """
        source = read_source_pipeline(name_or_path) if source is None else source
        start_as_source = "context_attention" not in config and not (
            config.get("embed_joint_sequence") or config.get("prefix_positions", "none") != "none"
        )
        if start_as_source:
            config = {**SOURCE_START, **config}
        if source.pooling_mode != "mean":
            warnings.warn(
                f"{name_or_path!r} pools with {source.pooling_mode!r}; the contextual model mean-pools its second "
                "stage, so it does not start with that encoder's embeddings.",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )
        model_dir = source.model_dir
        attn = _resolve_attn_implementation(config.get("attn_implementation", "auto"))
        family = get_adapter(AutoConfig.from_pretrained(model_dir).model_type).model_kwargs
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # the dropped pooler is expected, not worth a load report
        try:
            first = AutoModel.from_pretrained(model_dir, attn_implementation=attn, **family)
            second = AutoModel.from_pretrained(model_dir, attn_implementation=attn, **family)
        finally:
            transformers_logging.set_verbosity(verbosity)
        for encoder in (first, second):
            _own_storage(encoder)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if start_as_source and "context_layers" not in config:
            num_layers = second.config.num_hidden_layers
            config["context_layers"] = list(range(max(0, num_layers - SOURCE_START_READING_LAYERS), num_layers))
        if "max_seq_length" not in config:
            model_max = getattr(tokenizer, "model_max_length", 512) or 512
            limit = _position_limit(second) or 512
            config["max_seq_length"] = int(min(source.max_seq_length or model_max, model_max, 512, limit))
        return cls(first, second, tokenizer, **config)

    def __repr__(self) -> str:
        fields = {key: getattr(self, key) for key in self.config_keys}
        backbones = f"{self.first_stage.config.model_type}+{self.second_stage.config.model_type}"
        return f"ContextualTransformer(backbones={backbones}, {fields})"

    # ------------------------------------------------------------------ properties
    @property
    def max_seq_length(self) -> int:
        """Token limit of second-stage inputs (queries/documents); longer inputs are truncated."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self._max_seq_length = _check_seq_length("max_seq_length", value, self._modules.get("second_stage"))

    @property
    def context_max_seq_length(self) -> int:
        """Token limit of first-stage (context) documents."""
        return self._context_max_seq_length

    @context_max_seq_length.setter
    def context_max_seq_length(self, value: int) -> None:
        self._context_max_seq_length = _check_seq_length(
            "context_max_seq_length", value, self._modules.get("first_stage")
        )

    @property
    def device(self) -> torch.device:
        return self.null_vector.device

    @property
    def hidden_size(self) -> int:
        """Width of the context vectors and of the output embedding."""
        return self.second_stage.config.hidden_size

    def get_embedding_dimension(self) -> int:
        return self.hidden_size

    # ------------------------------------------------------------------ prompts
    # Inside a SentenceTransformer, the model's ``prompts`` are the one source of truth: ``query_prompt`` and
    # ``document_prompt`` read them (so ``model[0].set_context`` prefixes the context with the document prompt the
    # model has now, after ``model.prompts`` changed) and are saved as read. Outside one, the module's own values.
    def on_model_ready(self, model) -> None:
        self._owner = weakref.ref(model)  # weak: the model owns the module, not the other way round

    def _owner_model(self):
        owner = self.__dict__.get("_owner")
        model = owner() if owner is not None else None
        if model is None or not any(m is self for m in model._modules.values()):
            return None
        return model

    def _owner_prompts(self) -> dict[str, str] | None:
        model = self._owner_model()
        return None if model is None else getattr(model, "prompts", None) or {}

    def _set_prompt(self, name: str, value: str) -> None:
        setattr(self, f"_{name}_prompt", value)
        model = self._owner_model()
        if model is not None:  # the model's prompts are what is read: write there too, never a silent no-op
            if getattr(model, "prompts", None) is None:
                model.prompts = {}
            model.prompts[name] = value

    @property
    def query_prompt(self) -> str:
        prompts = self._owner_prompts()
        return self._query_prompt if prompts is None else prompts.get("query") or ""

    @query_prompt.setter
    def query_prompt(self, value: str) -> None:
        self._set_prompt("query", value)

    @property
    def document_prompt(self) -> str:
        prompts = self._owner_prompts()
        return self._document_prompt if prompts is None else prompts.get("document") or ""

    @document_prompt.setter
    def document_prompt(self, value: str) -> None:
        self._set_prompt("document", value)

    def __getstate__(self) -> dict[str, Any]:
        # A weak reference cannot be pickled (multi-process pools pickle the model): pickle the owner itself, which
        # is the model being pickled, so the copy points at the copied model.
        self._context_generation.share_memory_()  # in place: copies sent to other processes see later changes
        state = super().__getstate__().copy()
        owner = state.pop("_owner", None)
        state["_owner_model"] = owner() if owner is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        model = state.pop("_owner_model", None)
        super().__setstate__(state)
        self._owner = weakref.ref(model) if model is not None else None

    # ------------------------------------------------------------------ tokenisation
    def _tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        return dict(
            self.tokenizer(texts, padding=True, truncation="longest_first", max_length=max_length, return_tensors="pt")
        )

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs) -> dict[str, torch.Tensor | Any]:
        """Tokenise second-stage inputs (with ``prompt`` prepended); records ``prompt_length`` for pooling."""
        texts = validate_texts(inputs, what="input")
        if prompt:
            texts = [prompt + t for t in texts]
        features = self._tokenize(texts, self.max_seq_length)
        if prompt:
            features["prompt_length"] = self._prompt_length(prompt)
        return features

    def preprocess_context(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise first-stage (context) documents. Prompts must already be applied."""
        return self._tokenize(list(texts), self.context_max_seq_length)

    def _prompt_length(self, prompt: str) -> int:
        if prompt not in self._prompt_length_cache:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
            # [CLS] prompt [SEP]: the trailing special token is not part of the prompt.
            n = len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)
            self._prompt_length_cache[prompt] = n
        return self._prompt_length_cache[prompt]

    # ------------------------------------------------------------------ first stage
    def embed_context_features(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """First stage on tokenised documents: (n, L) ids -> (n, d2) context vectors. Differentiable."""
        hidden = self.first_adapter.forward(
            self.first_stage, features["input_ids"], features["attention_mask"], features.get("token_type_ids")
        )
        return self.context_head(_mean_pool(hidden, features["attention_mask"]))

    @torch.inference_mode()
    def embed_context_texts(
        self, texts: Sequence[str], batch_size: int = 32, show_progress_bar: bool | None = None
    ) -> torch.Tensor:
        """First stage on raw (already prompted) texts, batched, without grad: -> (n, d2)."""
        texts = list(texts)
        was_training = self.training
        self.eval()
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunks = []
        starts = range(0, len(texts), batch_size)
        for start in tqdm(starts, desc="Context (first stage)", disable=not show_progress_bar):
            batch = [texts[i] for i in order[start : start + batch_size]]
            features = {k: v.to(self.device) for k, v in self.preprocess_context(batch).items()}
            chunks.append(self.embed_context_features(features).float())
        self.train(was_training)
        if not chunks:
            return torch.zeros(0, self.hidden_size, device=self.device)
        vectors = torch.cat(chunks)
        return vectors[torch.as_tensor(np.argsort(order), device=vectors.device)]

    # ------------------------------------------------------------------ the context hook
    def embed_context(
        self,
        corpus: Sequence[str],
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> tuple[torch.Tensor, ContextInfo]:
        """Sample J documents of ``corpus`` (seeded), prefix them, and embed them with the first stage."""
        vectors, info, _ = self._embed_corpus(corpus, seed, prompt, batch_size, show_progress_bar)
        return vectors, info

    def _embed_corpus(self, corpus, seed, prompt, batch_size, show_progress_bar):
        """:meth:`embed_context`, plus the sampled (prompted) documents, which set_context keeps."""
        corpus = validate_texts(corpus)
        prompt = self.document_prompt if prompt is None else prompt
        # Position-free context rows (ours) read a set; cde-small-v2's rotary context rows read an order.
        keep_order = self.prefix_positions == "sequence"
        sampled = [prompt + t for t in sample_context(corpus, self.context_size, seed, keep_order=keep_order)]
        vectors = self.embed_context_texts(sampled, batch_size=batch_size, show_progress_bar=show_progress_bar)
        info = ContextInfo(
            size=len(sampled),
            seed=seed,
            fingerprint=fingerprint_texts(sampled),
            source="texts",
            prompt=prompt,
            corpus_size=len(corpus),
        )
        return vectors, info, sampled

    def set_context(
        self,
        context: Sequence[str] | torch.Tensor | np.ndarray,
        seed: int = 0,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> ContextInfo:
        """Make ``context`` the active context: corpus texts (sampled, prefixed, embedded once) or precomputed
        first-stage vectors of shape (n, hidden_size) with n <= context_size. Returns the :class:`ContextInfo`.

        The sample depends only on the corpus as a set of documents, ``context_size`` and ``seed`` (a non-negative
        int), not on the corpus order (see :func:`cde_st.context.sample_context`; an architecture whose context rows
        carry positions, cde-small-v2, gets the chosen documents in corpus order). A numpy array of strings counts
        as texts; vectors that require grad are used detached. The context stays current: if the weights it was
        embedded with change (training, an optimizer step, ``load_state_dict``, ``param.data = ...``), the next
        encode or :meth:`save` re-embeds the same documents."""
        if context is None:
            raise TypeError(
                "set_context: context is None. Give corpus texts (a list of strings) or first-stage vectors of "
                f"shape (n, {self.hidden_size}); to remove the active context, call clear_context()."
            )
        if isinstance(context, np.ndarray) and context.dtype.kind in "USO":
            context = context.tolist()  # strings (or objects, checked as texts)
        if isinstance(context, (torch.Tensor, np.ndarray)):
            vectors = self.validate_context_vectors(context).detach()
            info = ContextInfo(
                size=len(vectors), seed=None, fingerprint=fingerprint_array(vectors.cpu().numpy()), source="vectors"
            )
            texts = None
        else:
            vectors, info, texts = self._embed_corpus(context, check_seed(seed), prompt, batch_size, show_progress_bar)
        self._activate_context(vectors, info, texts)
        return info

    def _activate_context(
        self,
        vectors: torch.Tensor | None,
        info: ContextInfo | None,
        texts: list[str] | None,
        weights: torch.Tensor | None = None,
    ):
        """The one place the active context changes (None: no context). ``texts``: the prompted documents the
        vectors were embedded from, kept to re-embed them if the first stage changes. ``weights``: the first-stage
        fingerprint the vectors belong to (None: the current weights, i.e. the vectors were just computed)."""
        self._drop_context_cache()
        if info is not self.context_info:  # a new context (re-embedding the same one after training is not)
            self._context_generation += 1
            self._context_generation_seen = int(self._context_generation)
        self.context_vectors = None if vectors is None else vectors.detach().to(self.device)
        self.context_info = info
        self._context_texts = texts
        self._context_token_ids = None
        if texts:
            ids = self.preprocess_context(texts)["input_ids"]

            self._context_token_ids = torch.unique(ids).to(self.device)
        if vectors is None:
            self._context_weights = None
        else:
            self._context_weights = self._first_stage_fingerprint() if weights is None else weights
        self._warned_stale_context = False

    def context_snapshot(self) -> tuple:
        """The active context as an opaque value for :meth:`restore_context` (to set a context temporarily). It
        remembers which first-stage weights the vectors came from, so restoring it after the weights changed
        re-embeds them at the next use instead of passing them off as current."""
        return self.context_vectors, self.context_info, self._context_texts, self._context_weights

    def restore_context(self, snapshot: tuple) -> None:
        """Make a :meth:`context_snapshot` the active context again."""
        vectors, info, texts, weights = snapshot
        self._activate_context(vectors, info, texts, weights=weights)

    # ------------------------------------------------------------------ keeping the context fresh
    @torch.no_grad()
    def _first_stage_fingerprint(self) -> torch.Tensor:

        """:func:`_values_fingerprint` of what the active context vectors are computed from: the first stage and
        the context head, of the input-embedding table only the rows of the context's tokens (all rows for vectors
        given directly). One read of those weights (MiniLM, 64 documents: ~12M values)."""
        table = self.first_stage.get_input_embeddings().weight
        tensors = [p for p in self.first_stage.parameters() if p is not table]
        tensors += list(self.context_head.parameters())
        ids = self._context_token_ids
        tensors.append(table if ids is None else table[ids.to(table.device)])
        return _values_fingerprint(tensors)

    def _second_stage_fingerprint(self) -> torch.Tensor:
        """:func:`_values_fingerprint` of the second-stage weights behind the cached keys/values (its layers; the
        input-embedding table is not used by the prefix rows)."""
        table = self.second_stage.get_input_embeddings().weight
        return _values_fingerprint([p for p in self.second_stage.parameters() if p is not table])

    def _check_weights(self) -> None:
        """Before an inference forward uses the active context or the cached keys/values: if a check is due, compare
        the fingerprints of the weights they came from with the current ones (re-embed the context, drop the
        cache where they differ). Due once per encode call (sentence-transformers' encode calls eval()) and
        whenever a parameter's storage or version counter moved, so direct forward calls see ordinary edits too;
        batches of one encode call then cost only the version look-up."""
        if not self._weights_check_due and self._weights_key is not None:
            params, key = self._weights_key
            if key == tuple((p.data_ptr(), p._version) for p in params):
                return
        self.refresh_context()
        if self._context_cache is not None and not torch.equal(
            self._context_cache[1], self._second_stage_fingerprint()
        ):
            self._drop_context_cache()
        params = list(self.parameters())  # listed once per check: walking the module tree per batch costs ~1 ms
        self._weights_key = (params, tuple((p.data_ptr(), p._version) for p in params))
        self._weights_check_due = False

    def refresh_context(self) -> bool:
        """Recompute the active context if the first stage changed since it was set (e.g. by training).

        The check compares a fingerprint of the weights' values (:func:`_values_fingerprint`), so any way of
        changing them counts: optimizer steps (fused ones too), ``param.data = ...``, in-place edits,
        ``load_state_dict``. A context set from texts is re-embedded from the same sampled documents (its
        fingerprint stays the same); vectors given directly cannot be recomputed, and a warning says so once.
        Called before the first batch of every encode that uses the active context and by :meth:`save`, so a
        stale context is never used or written. Returns whether the context was recomputed."""
        if self.context_vectors is None or self._context_weights is None:
            return False
        if torch.equal(self._first_stage_fingerprint(), self._context_weights):
            return False

        if self._context_texts is None:
            if not self._warned_stale_context:
                warnings.warn(
                    "The first stage changed since the context vectors were set (given as vectors, so they cannot be "
                    "recomputed): they may be stale. Call set_context(corpus_texts) again.",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
                self._warned_stale_context = True
            return False
        logger.info(
            "The first stage changed since set_context: re-embedding the %d context documents.",
            len(self._context_texts),
        )
        self._activate_context(self.embed_context_texts(self._context_texts), self.context_info, self._context_texts)
        return True

    def _check_pool_context(self) -> None:
        """In a copy made for another process (a multi-process pool's worker): raise if the original's context
        changed since the copy was made, instead of encoding with the stale one."""
        if int(self._context_generation) != self._context_generation_seen:
            raise RuntimeError(
                "The context of this model changed after its multi-process pool was started, and the pool's workers "
                "still hold the old one. Start the pool after set_context (model.stop_multi_process_pool(pool); "
                "pool = model.start_multi_process_pool(...)), pass the context as dataset_embeddings=, or load the "
                "model with cde_st.ContextualSentenceTransformer(path), whose pools always get the current context."
            )

    def clear_context(self) -> None:
        """Forget the active context: encoding falls back to the null context (with a warning)."""
        self._activate_context(None, None, None)
        self._warned_null_context = False

    def validate_context_vectors(self, vectors: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Check precomputed first-stage vectors: 2-D, width hidden_size, at most context_size rows, finite."""
        if isinstance(vectors, np.ndarray):
            vectors = torch.from_numpy(vectors)
        if not isinstance(vectors, torch.Tensor):
            raise TypeError(f"Context vectors must be a torch.Tensor or numpy array, got {type(vectors).__name__}.")
        if vectors.ndim != 2 or vectors.shape[1] != self.hidden_size:
            raise ValueError(
                f"Context vectors must have shape (n, {self.hidden_size}) (first-stage output width); "
                f"got {tuple(vectors.shape)}."
            )
        if vectors.shape[0] > self.context_size:
            raise ValueError(
                f"Got {vectors.shape[0]} context vectors but the model has context_size={self.context_size}; "
                "sample at most that many documents (set_context(texts) samples for you)."
            )
        if not torch.isfinite(vectors.detach()).all():
            raise ValueError("Context vectors contain NaN or infinite values.")
        return vectors.float()  # differentiable: vectors that require grad (training) keep their gradient path

    def warn_null_context(self, stacklevel: int | None = None) -> None:
        """Warn (once until a context is set) that encoding uses the null context."""
        if self.context_size > 0 and not self._warned_null_context:
            warnings.warn(
                "No context is set: encoding with the null context (the model then acts as a plain bi-encoder). "
                "Call model.set_context(corpus_texts) first, or pass dataset_embeddings=.",
                UserWarning,
                stacklevel=caller_stacklevel() if stacklevel is None else stacklevel,
            )
            self._warned_null_context = True

    def _context_slots(self, dataset_embeddings: torch.Tensor | np.ndarray | None, dtype) -> torch.Tensor:
        """The (J, d2) context the second stage sees: given/active vectors, null-padded, with sequence dropout."""
        if dataset_embeddings is None and not self.training:
            self._check_weights()
        if dataset_embeddings is None:
            self._check_pool_context()
        if dataset_embeddings is not None:
            # Checked whether or not they require grad: NaN or too many rows must fail in training as well.
            vectors = self.validate_context_vectors(dataset_embeddings).to(device=self.device, dtype=dtype)
        elif self.context_vectors is not None:
            vectors = self.context_vectors.to(dtype)
            if vectors.is_inference() and not torch.is_inference_mode_enabled():
                vectors = vectors.clone()  # embedded under inference mode; autograd may need to save them
        else:
            if not self.training:
                self.warn_null_context()
            vectors = self.null_vector.new_zeros(0, self.hidden_size).to(dtype)
        n_missing = self.context_size - vectors.shape[0]
        if n_missing > 0 and self.context_padding == "tile" and len(vectors):
            vectors = vectors[self._tile_index(len(vectors))]
        elif n_missing > 0:
            vectors = torch.cat([vectors, self.null_vector.to(dtype).expand(n_missing, -1)])
        if self.training and self.sequence_dropout > 0 and self.context_size > 0:
            drop = torch.rand(vectors.shape[0], device=vectors.device) < self.sequence_dropout
            vectors = torch.where(drop.unsqueeze(-1), self.null_vector.to(dtype).expand_as(vectors), vectors)
        return vectors

    def _tile_index(self, n: int) -> torch.Tensor:
        """Which of n given vectors fills each of the J slots under ``context_padding="tile"``: the same even
        repetition set_context uses for a small corpus."""
        return torch.as_tensor(sample_indices(n, self.context_size, seed=0), device=self.device)

    def _prefix_mask(self, context_mask: torch.Tensor, num_given: int, batch: int, num_prefix: int) -> torch.Tensor:
        """(B, J') per-row visibility of the given context vectors -> (B, P) visibility of every prefix slot:
        null-padding and soft-prompt slots are always visible, tiled slots follow the vector they repeat."""
        if context_mask.dim() != 2 or tuple(context_mask.shape) != (batch, num_given):
            raise ValueError(
                f"context_mask must be (batch, context vectors) = ({batch}, {num_given}), "
                f"got {tuple(context_mask.shape)}."
            )
        mask = context_mask.to(device=self.device, dtype=torch.bool)
        if num_given < self.context_size and self.context_padding == "tile" and num_given:
            mask = mask[:, self._tile_index(num_given)]
        return torch.cat([mask, mask.new_ones(batch, num_prefix - mask.shape[1])], dim=1)

    # ------------------------------------------------------------------ second stage
    def forward(
        self,
        features: dict[str, torch.Tensor],
        dataset_embeddings: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> dict[str, torch.Tensor]:
        """Second stage: (B, L) ids + (J, d2) context -> ``sentence_embedding`` (B, d2), ``token_embeddings``
        (B, L, d2) of the text positions only.

        ``context_mask`` (B, J') bool, with ``dataset_embeddings`` (J', d2): which context vectors each row may
        read (training hides a pair's own document from it, see ``FilteredInfoNCELoss(leave_one_out=True)``).
        In cached mode it hides the slot's keys/values; the other slots, which attended to it inside the
        context, are not recomputed."""
        if context_mask is not None and dataset_embeddings is None:
            raise ValueError("context_mask needs the context it masks: pass dataset_embeddings as well.")
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        adapter, backbone = self.second_adapter, self.second_stage
        if self.embed_joint_sequence:
            text = adapter.embed_tokens_unnormalised(backbone, input_ids)
        else:
            text = adapter.embed_tokens(backbone, input_ids, features.get("token_type_ids"))
        prefix = self._context_slots(dataset_embeddings, text.dtype)  # (J, d2)
        num_ctx = prefix.shape[0]
        if self.soft_prompt is not None:
            prefix = torch.cat([prefix, self.soft_prompt().to(text.dtype)])  # (J + n_prompt, d2)
        batch, num_prefix = input_ids.shape[0], prefix.shape[0]
        prefix_mask = None
        if context_mask is not None:
            prefix_mask = self._prefix_mask(context_mask, len(dataset_embeddings), batch, num_prefix)
        if self._split_attention and num_prefix > 0:
            cached = None
            if self.context_attention == "cached":
                # Reused only without autograd: a differentiable forward needs the graph through the prefix rows.
                reusable = dataset_embeddings is None and not self.training and not torch.is_grad_enabled()
                cached = self._cached_states(prefix, reusable=reusable)
            out = adapter.encode_split(
                backbone, prefix, text, attention_mask, cached, self.gates, self.context_layers, prefix_mask
            )
        else:  # joint attention; also the split modes with no prefix row (J = 0), which then read no context
            hidden = torch.cat([prefix.unsqueeze(0).expand(batch, -1, -1), text], dim=1)  # (B, P + L, d2)
            if self.embed_joint_sequence:
                hidden = adapter.embed_sequence(backbone, hidden)
            if prefix_mask is None:
                prefix_mask = attention_mask.new_ones(batch, num_prefix)
            joint_mask = torch.cat([prefix_mask.to(attention_mask.dtype), attention_mask], dim=1)
            positions = self._position_ids(num_ctx, num_prefix, input_ids.shape[1], input_ids.device)
            out = adapter.encode(backbone, hidden, joint_mask, positions, num_prefix, self.local_attention_scope)
            out = out[:, num_prefix:]

        pool_mask = attention_mask
        prompt_length = features.get("prompt_length")
        if not self.include_prompt and prompt_length is not None:
            pl = int(prompt_length[0]) if isinstance(prompt_length, torch.Tensor) else int(prompt_length)
            pool_mask = attention_mask.clone()
            pool_mask[:, :pl] = 0
        if self._instruction_token_id is not None:
            pool_mask = self._skip_instruction(input_ids, pool_mask)
        features["token_embeddings"] = out
        features["sentence_embedding"] = self.head(_mean_pool(out, pool_mask))
        return features

    def added_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters cde_st adds to the two pretrained encoders (context head, output head, null vector,
        context gates, soft prompt): new, so an optimiser may give them their own learning rate."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith(("first_stage.", "second_stage."))]

    @property
    def _split_attention(self) -> bool:
        return self.context_attention == "cached" or self.context_gate

    def _drop_context_cache(self, *args, **kwargs) -> None:
        self._context_cache = None

    def train(self, mode: bool = True):
        if mode:
            self._drop_context_cache()  # weights are about to change
        else:
            self._weights_check_due = True  # encode() calls eval(): check the weights once per call
        return super().train(mode)

    def _cached_states(self, prefix: torch.Tensor, reusable: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The prefix's per-layer keys/values (cached mode); kept while the prefix rows (context vectors, null
        vector, soft prompt) stay equal and the second stage unchanged (:meth:`_check_weights`)."""
        if not reusable:
            return self.second_adapter.context_states(self.second_stage, prefix, self.context_layers)
        cache = self._context_cache
        # An exact comparison of the (P, d) prefix per batch: cheap next to the batch, and it sees every edit.
        stale = cache is None or (cache[0].dtype, cache[0].device) != (prefix.dtype, prefix.device)
        if stale or not torch.equal(cache[0], prefix):

            with torch.no_grad():
                states = self.second_adapter.context_states(self.second_stage, prefix, self.context_layers)
                self._context_cache = (prefix.detach().clone(), self._second_stage_fingerprint(), states)
        return self._context_cache[2]

    def context_cache_bytes(self) -> int:
        """Memory held by the cached keys/values of the active context (0 when nothing is cached)."""
        if self._context_cache is None:
            return 0
        return sum(t.numel() * t.element_size() for kv in self._context_cache[2] if kv is not None for t in kv)


    def _position_ids(self, num_ctx: int, num_prefix: int, text_length: int, device) -> torch.Tensor:
        """One rotary position per row of [context ; soft prompt ; text] (NO_POSITION: no rotation)."""
        if self.prefix_positions == "none":
            prefix = torch.full((num_prefix,), NO_POSITION, dtype=torch.long, device=device)
            return torch.cat([prefix, torch.arange(text_length, device=device)])
        positions = torch.arange(num_prefix + text_length, device=device)
        if self.prefix_positions == "sequence_except_context":
            positions[:num_ctx] = NO_POSITION
        return positions

    def _skip_instruction(self, input_ids: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
        """Drop positions 0..p from pooling, p the first position > 0 holding the instruction delimiter (if any)."""
        hits = (input_ids == self._instruction_token_id) & pool_mask.bool()
        hits[:, 0] = False
        found = hits.any(dim=1, keepdim=True)
        end = hits.int().argmax(dim=1, keepdim=True)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return pool_mask * ~(found & (positions <= end))

    # ------------------------------------------------------------------ persistence
    def get_config_dict(self) -> dict[str, Any]:
        config = super().get_config_dict()
        config["first_stage_config"] = self.first_stage.config.to_diff_dict() | {
            "model_type": self.first_stage.config.model_type
        }
        config["second_stage_config"] = self.second_stage.config.to_diff_dict() | {
            "model_type": self.second_stage.config.model_type
        }
        config["context_info"] = self.context_info.to_dict() if self.context_info is not None else None
        return config

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        os.makedirs(output_path, exist_ok=True)
        self.save_config(output_path)
        if safe_serialization:
            # The metadata records what the weights go with (encoder configs, tokenizer size), checked on load.
            stages = {stage: getattr(self, stage).config for stage in STAGES}
            metadata = save_metadata(stages, self.tokenizer)
            save_model(self, os.path.join(output_path, "model.safetensors"), metadata=metadata)
        else:
            self.save_torch_weights(output_path, safe_serialization=False)
        self.save_tokenizer(output_path)
        context_path = os.path.join(output_path, CONTEXT_FILE)
        if self.context_vectors is not None:
            self.refresh_context()  # never write vectors of an older first stage
            # the sampled documents go with the vectors, so a loaded model can re-embed them after more training
            metadata = {"texts": json.dumps(self._context_texts)} if self._context_texts is not None else None
            save_file(
                {"vectors": self.context_vectors.detach().float().cpu().contiguous()}, context_path, metadata=metadata
            )
        elif os.path.exists(context_path):
            os.remove(context_path)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        backend: str = "torch",
        model_kwargs: dict[str, Any] | None = None,
        **kwargs,
    ) -> ContextualTransformer:
        """Load a saved module. Of sentence-transformers' loading options, ``model_kwargs`` ``dtype`` (or
        ``torch_dtype``; "auto": the saved dtype) and ``attn_implementation`` apply to both encoders; other
        ``model_kwargs``, ``config_kwargs`` and ``processor_kwargs`` are ignored with a warning; a ``backend``
        other than "torch" is an error.

        The folder must be whole (:mod:`cde_st.modules.integrity`): a tokenizer that fits the embedding tables,
        weights named and shaped as ``cde_config.json`` says and saved with the same encoder configs, no NaN/inf.
        Anything else is a ValueError naming the folder, the file and the field."""
        check_backend(backend)
        dtype, attn_implementation = split_model_kwargs(model_kwargs, "ContextualTransformer.load", **kwargs)
        hub = dict(
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        config_path = load_file_path(model_name_or_path, cls.config_file_name, **hub)
        if config_path is None:
            raise FileNotFoundError(f"No {cls.config_file_name} in {model_name_or_path!r}: not a cde_st model.")
        config = cls._read_config(config_path)
        context_info = config.pop("context_info", None)
        first, second = config.pop("first_stage_config"), config.pop("second_stage_config")
        dtype = _resolve_dtype(dtype, second)
        tokenizer_dir = cls.load_dir_path(model_name_or_path, **hub)
        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(
                f"The tokenizer of {tokenizer_source(tokenizer_dir)} cannot be loaded ({type(exc).__name__}: {exc}). "
                "Put the tokenizer files the model was saved with (tokenizer.json, tokenizer_config.json) back "
                "beside the weights, or save the model again."
            ) from None
        saved_attn = config.get("attn_implementation", "auto")
        if attn_implementation is not None:
            config["attn_implementation"] = attn_implementation
        try:
            module = cls(first, second, tokenizer, **config)
        except (ValueError, TypeError) as exc:  # a field of the wrong type or value
            raise ValueError(f"{config_path}: {exc}") from None
        # A load-time choice (like transformers' attn_implementation): a later save keeps the saved value.
        module.attn_implementation = saved_attn
        weights = load_file_path(model_name_or_path, "model.safetensors", **hub) or load_file_path(
            model_name_or_path, "pytorch_model.bin", **hub
        )
        module._load_weights(weights, config_path, tokenizer_dir)
        if dtype is not None:
            module.to(dtype)  # before the context is restored: the saved context vectors stay float32
        context_path = load_file_path(model_name_or_path, CONTEXT_FILE, **hub)
        expected_path = os.path.join(model_name_or_path, subfolder, CONTEXT_FILE)
        module._load_context(context_path or expected_path, context_path is not None, context_info, config_path)
        return module

    def _load_weights(self, weights: str | None, config_path: str, tokenizer_dir: str | None) -> None:
        """Load ``model.safetensors`` (or ``pytorch_model.bin``) into the module built from ``config_path``, once
        the folder is known to be whole (:mod:`cde_st.modules.integrity`): the encoder configs the weights were
        saved with, every tensor's name and shape, the tokenizer against the embedding tables, finite values."""
        if weights is None:
            folder = os.path.dirname(config_path)
            raise FileNotFoundError(
                f"{folder} has no model.safetensors (or pytorch_model.bin) beside {os.path.basename(config_path)}: "
                "the weights are missing. Copy them from where the model was saved."
            )
        try:
            if weights.endswith(".safetensors"):
                with safe_open(weights, framework="pt") as f:
                    metadata = f.metadata() or {}
                    state = {key: f.get_tensor(key) for key in f.keys()}
            else:
                metadata, state = {}, torch.load(weights, map_location="cpu", weights_only=True)
        except (SafetensorError, EOFError, pickle.UnpicklingError) as exc:
            raise _corrupt_file_error(weights, exc) from None
        check_recorded_configs(self, metadata, weights, config_path)
        check_state_dict(self, {key: tuple(t.shape) for key, t in state.items()}, weights, config_path)
        recorded = metadata.get(META_TOKENIZER_SIZE)
        check_tokenizer(
            self.tokenizer,
            {stage: getattr(self, stage).get_input_embeddings().num_embeddings for stage in STAGES},
            tokenizer_source(tokenizer_dir),
            weights,
            int(recorded) if recorded is not None else None,
        )
        self.load_state_dict(state, strict=False)  # strict in effect: check_state_dict compared every name
        check_finite(self, weights)

    @classmethod
    def _read_config(cls, config_path: str) -> dict[str, Any]:
        """``cde_config.json`` as a dict, with every problem (not JSON, missing or unknown fields) named."""
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"{config_path} is not valid JSON ({exc}): the file is truncated or corrupt. Save the model again."
            ) from None
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} must hold a JSON object (the module's settings), got {config!r:.80}.")
        for old_key, new_key in cls.config_key_renames.items():
            if old_key in config and new_key not in config:
                config[new_key] = config.pop(old_key)
        for key in ("first_stage_config", "second_stage_config"):
            if not isinstance(config.get(key), dict) or "model_type" not in config[key]:
                found = "missing" if key not in config else f"{config[key]!r:.80}"
                raise ValueError(
                    f"{config_path}: {key!r} must be the encoder's config (an object with 'model_type'), "
                    f"got {found}. The file is incomplete; save the model again."
                )
        known = {*cls.config_keys, "first_stage_config", "second_stage_config", "context_info"}
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

    def _load_context(self, context_path: str, exists: bool, context_info: dict | None, config_path: str) -> None:
        """Restore the saved context: ``context.safetensors`` must agree with the ``context_info`` that
        ``cde_config.json`` records, and passes the checks of :meth:`validate_context_vectors`."""
        if context_info is None:
            if exists:
                warnings.warn(
                    f"{context_path} is ignored: {config_path} records no context (context_info is null). "
                    "The model loads with no context; call set_context(...) or delete the stray file.",
                    UserWarning,
                    stacklevel=caller_stacklevel(),
                )
            return
        try:
            info = ContextInfo(**context_info)
        except TypeError as exc:
            raise ValueError(f"{config_path}: context_info={context_info!r} is invalid ({exc}).") from None
        if not exists:
            raise FileNotFoundError(
                f"{context_path} is missing, but {config_path} records a context (context_info={context_info}). "
                f"Restore {CONTEXT_FILE} from where the model was saved, or set context_info to null in "
                f"{os.path.basename(config_path)} to load the model without a context."
            )
        try:
            with safe_open(context_path, framework="pt") as f:
                tensors = {key: f.get_tensor(key) for key in f.keys()}
                texts = (f.metadata() or {}).get("texts")  # the sampled documents, when set from texts
        except SafetensorError as exc:
            raise _corrupt_file_error(context_path, exc) from None
        if "vectors" not in tensors:
            raise ValueError(f"{context_path} has no 'vectors' tensor (it holds {sorted(tensors)}).")
        try:
            vectors = self.validate_context_vectors(tensors["vectors"])
        except ValueError as exc:
            raise ValueError(f"{context_path}: {exc}") from None
        if len(vectors) != info.size:
            raise ValueError(
                f"{context_path} holds {len(vectors)} context vectors, but {config_path} records "
                f"context_info.size={info.size}: the two files do not belong together."
            )
        self._activate_context(vectors, info, json.loads(texts) if texts else None)


def _own_storage(model: nn.Module) -> None:
    """Give every parameter its own storage. Checkpoints in a packed layout (NomicBERT's ``Wqkv``) load as views of
    one tensor, which safetensors refuses to save."""
    for param in model.parameters():
        if param.untyped_storage().nbytes() != param.numel() * param.element_size():
            param.data = param.data.clone()


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


def _check_encoder_location(name_or_path: str) -> str:
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
    name_or_path = _check_encoder_location(name_or_path)
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
    max_len = None
    cfg_path = load_file_path(name_or_path, "sentence_bert_config.json", subfolder=transformer["path"])
    if cfg_path is not None:
        with open(cfg_path, encoding="utf-8") as f:
            max_len = json.load(f).get("max_seq_length")
    pooling = next((m for m in modules if m["type"].endswith("Pooling")), None)
    mode = "mean" if pooling is None else Pooling.load_config(name_or_path, subfolder=pooling["path"])["pooling_mode"]
    if isinstance(mode, (list, tuple)):  # several modes are concatenated; one mode in a list is that mode
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    return SourcePipeline(model_dir, max_len, mode, normalize)


# A stable class reference in modules.json, independent of the file layout.
ContextualTransformer.__module__ = "cde_st"
