"""How the second stage's text reads the context: :func:`encode_with_context`, one dispatch over two paths.

- **joint** (``context_attention="joint"`` without a gate: the paper, and the released cde-small-v1/v2 modes; also
  any mode with no prefix row): ``[prefix ; text]`` runs through the HF encoder's own layers
  (:meth:`~cde_st.modules.backbone.BackboneAdapter.encode`), so the attention kernel is the encoder's
  ``attn_implementation`` (SDPA, eager or flash-attention 2). Prefix rows get rotary positions as
  ``prefix_positions`` says.
- **split** (``context_attention="cached"`` and/or ``context_gate=True``: cde_st's own modes): cde_st's layer
  attention (:meth:`~cde_st.modules.backbone.BackboneAdapter.encode_split`, reusing every weight of the pretrained
  layers), always through :func:`torch.nn.functional.scaled_dot_product_attention` whatever
  ``attn_implementation`` says. In cached mode the prefix rows attend only to each other, so their per-layer keys
  and values are computed once per context and kept (:class:`ContextKVCache`) while the prefix and the
  second-stage weights stay the same.

The prefix is ``[context slots ; soft prompt]`` (:func:`context_slots`: the context null-padded or tiled to J
slots); ``context_mask`` (per row, which context vectors it may read) becomes a mask over every prefix slot
(:func:`prefix_mask`). Everything here gets what it reads as arguments: the module calls it, it never calls back.

Example:
    >>> text = encode_with_context(                                                    # doctest: +SKIP
    ...     features, vectors, None, adapter=module.second_adapter, backbone=module.second_stage,
    ...     config=module.config, null_vector=module.null_vector, soft_prompt=None, gates=None,
    ...     cache=ContextKVCache(), training=False, reusable=True)                      # (B, L, d)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cde_st.context import sample_indices
from cde_st.modules.backbone import NO_POSITION, BackboneAdapter
from cde_st.modules.contextual_config import ContextualConfig
from cde_st.modules.freshness import values_fingerprint


def tile_index(n: int, context_size: int, device) -> torch.Tensor:
    """Which of n given vectors fills each of the J slots under ``context_padding="tile"``: the same even
    repetition set_context uses for a small corpus."""
    return torch.as_tensor(sample_indices(n, context_size, seed=0), device=device)


def centred_rows(vectors: torch.Tensor) -> torch.Tensor:
    """(J', d) context vectors less their mean, each scaled back to the rows' mean norm (``context_centering``).

    Pooled embeddings of one corpus's documents share most of their direction (cosine 0.88 between MiniLM's pooled
    vectors of a generated domain's documents, and 0.99 between their keys in the layers that read them), so a text
    token cannot tell one context row from another; less the mean, each row is what sets its document apart."""
    residual = vectors - vectors.mean(dim=0, keepdim=True)
    norm = vectors.norm(dim=-1).mean()
    return residual * (norm / residual.norm(dim=-1, keepdim=True).clamp_min(1e-3 * norm))


def context_slots(
    vectors: torch.Tensor, null_vector: torch.Tensor, config: ContextualConfig, training: bool
) -> torch.Tensor:
    """(J', d) context vectors -> the (J, d) slots the second stage sees: null-padded (or tiled, ``context_padding``),
    with sequence dropout while ``training``. ``null_vector`` (d,) in the vectors' dtype."""
    if config.context_centering and len(vectors) > 1:
        vectors = centred_rows(vectors)
    n_missing = config.context_size - vectors.shape[0]
    if n_missing > 0 and config.context_padding == "tile" and len(vectors):
        vectors = vectors[tile_index(len(vectors), config.context_size, vectors.device)]
    elif n_missing > 0:
        vectors = torch.cat([vectors, null_vector.expand(n_missing, -1)])
    if training and config.sequence_dropout > 0 and config.context_size > 0:
        drop = torch.rand(vectors.shape[0], device=vectors.device) < config.sequence_dropout
        vectors = torch.where(drop.unsqueeze(-1), null_vector.expand_as(vectors), vectors)
    return vectors


def prefix_mask(
    context_mask: torch.Tensor, num_given: int, batch: int, num_prefix: int, config: ContextualConfig, device
) -> torch.Tensor:
    """(B, J') per-row visibility of the given context vectors -> (B, P) visibility of every prefix slot:
    null-padding and soft-prompt slots are always visible, tiled slots follow the vector they repeat."""
    if context_mask.dim() != 2 or tuple(context_mask.shape) != (batch, num_given):
        raise ValueError(
            f"context_mask must be (batch, context vectors) = ({batch}, {num_given}), got {tuple(context_mask.shape)}."
        )
    mask = context_mask.to(device=device, dtype=torch.bool)
    if num_given < config.context_size and config.context_padding == "tile" and num_given:
        mask = mask[:, tile_index(num_given, config.context_size, device)]
    return torch.cat([mask, mask.new_ones(batch, num_prefix - mask.shape[1])], dim=1)


def position_ids(config: ContextualConfig, num_ctx: int, num_prefix: int, text_length: int, device) -> torch.Tensor:
    """One rotary position per row of [context ; soft prompt ; text] (NO_POSITION: no rotation)."""
    if config.prefix_positions == "none":
        prefix = torch.full((num_prefix,), NO_POSITION, dtype=torch.long, device=device)
        return torch.cat([prefix, torch.arange(text_length, device=device)])
    positions = torch.arange(num_prefix + text_length, device=device)
    if config.prefix_positions == "sequence_except_context":
        positions[:num_ctx] = NO_POSITION
    return positions


def embed_text(
    features: dict[str, torch.Tensor], *, adapter: BackboneAdapter, backbone: nn.Module, config: ContextualConfig
) -> torch.Tensor:
    """(B, L) ids of ``features`` -> (B, L, d) second-stage inputs of the text rows."""
    if config.embed_joint_sequence:
        return adapter.embed_tokens_unnormalised(backbone, features["input_ids"])
    return adapter.embed_tokens(backbone, features["input_ids"], features.get("token_type_ids"))


def context_prefix(
    vectors: torch.Tensor,
    null_vector: torch.Tensor,
    soft_prompt: nn.Module | None,
    config: ContextualConfig,
    training: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """(J', d) context vectors -> the (P, d) prefix ``[context slots ; soft prompt]`` in ``dtype`` (J context rows
    first: :func:`context_slots`)."""
    prefix = context_slots(vectors.to(dtype), null_vector.to(dtype), config, training)  # (J, d)
    if soft_prompt is not None:
        prefix = torch.cat([prefix, soft_prompt().to(dtype)])  # (J + n_prompt, d)
    return prefix


def read_prefix(
    text: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix: torch.Tensor | None,
    cached: list[tuple[torch.Tensor, torch.Tensor] | None] | None,
    visible: torch.Tensor | None,
    *,
    adapter: BackboneAdapter,
    backbone: nn.Module,
    config: ContextualConfig,
    gates: torch.Tensor | None,
) -> torch.Tensor:
    """The second stage's layers: (B, L, d) ``text`` rows read the (P, d) ``prefix`` -> (B, L, d) text states.

    ``cached``: the prefix's per-layer keys/values (cached mode; ``prefix`` may then be None), else None.
    ``visible`` (B, P) bool or None: which prefix rows each text row may read (:func:`prefix_mask`)."""
    num_prefix = prefix.shape[0] if prefix is not None else next(s[0].shape[2] for s in cached if s is not None)
    if config.split_attention and num_prefix > 0:
        return adapter.encode_split(
            backbone, prefix, text, attention_mask, cached, gates, config.context_layers, visible, config.context_sink
        )
    # joint attention; also the split modes with no prefix row (J = 0), which then read no context
    batch = text.shape[0]
    hidden = torch.cat([prefix.unsqueeze(0).expand(batch, -1, -1), text], dim=1)  # (B, P + L, d)
    if config.embed_joint_sequence:
        hidden = adapter.embed_sequence(backbone, hidden)
    if visible is None:
        visible = attention_mask.new_ones(batch, num_prefix)
    joint_mask = torch.cat([visible.to(attention_mask.dtype), attention_mask], dim=1)
    positions = position_ids(config, config.context_size, num_prefix, text.shape[1], text.device)
    out = adapter.encode(backbone, hidden, joint_mask, positions, num_prefix, config.local_attention_scope)
    return out[:, num_prefix:]


def reads_cached_states(config: ContextualConfig) -> bool:
    """Whether the text reads the prefix through per-layer keys/values computed once per context (cached mode with
    at least one prefix row)."""
    return config.context_attention == "cached" and config.context_size + config.soft_prompt_tokens > 0


def stacked_states(cached: list[tuple[torch.Tensor, torch.Tensor] | None]) -> torch.Tensor:
    """Per-layer keys/values ``[(k, v) or None]`` with k, v (1, H, P, hd) -> (R, 2, H, P, hd) over the R layers
    that read the prefix: the exported second stage's context input in cached mode."""
    return torch.stack([torch.stack([kv[0][0], kv[1][0]]) for kv in cached if kv is not None])


def encode_with_context(
    features: dict[str, torch.Tensor],
    vectors: torch.Tensor,
    context_mask: torch.Tensor | None,
    *,
    adapter: BackboneAdapter,
    backbone: nn.Module,
    config: ContextualConfig,
    null_vector: torch.Tensor,
    soft_prompt: nn.Module | None,
    gates: torch.Tensor | None,
    cache: ContextKVCache,
    training: bool,
    reusable: bool,
    verify_cache: bool = False,
    runtime: Any = None,
) -> torch.Tensor:
    """The second stage: (B, L) ids of ``features`` read (J', d) context ``vectors`` -> (B, L, d) text states.

    ``context_mask`` (B, J') or None: which vectors each row may read. ``reusable``: inference, so ``cache`` may
    keep the prefix's keys/values and reuse them for an equal prefix when nothing needs their gradient.
    ``verify_cache``: first drop the cached keys/values if the second stage changed since they were computed (the
    module asks once per encode call, with its weights check). ``runtime``: an exported graph that runs the layers
    in place of torch (:class:`~cde_st.modules.onnx_runtime.OnnxRuntime`); the prefix and its keys/values are
    still made here, once per context."""
    if verify_cache:
        cache.drop_if_stale(backbone)
    if runtime is not None:
        if training and torch.is_grad_enabled():
            raise ValueError("A model loaded with backend='onnx' runs exported graphs and cannot train.")
        if context_mask is not None:
            raise ValueError("context_mask is not supported by an exported (ONNX) model: load it with backend='torch'.")
        prefix = context_prefix(vectors, null_vector, soft_prompt, config, False, torch.float32)
        reuse = reusable and not torch.is_grad_enabled()
        cached = cache.states(prefix, adapter, backbone, config.context_layers, reuse) if runtime.reads_states else None
        return runtime.second_stage(features, prefix, cached)
    text = embed_text(features, adapter=adapter, backbone=backbone, config=config)
    prefix = context_prefix(vectors, null_vector, soft_prompt, config, training, text.dtype)
    visible = None
    if context_mask is not None:
        visible = prefix_mask(context_mask, len(vectors), text.shape[0], prefix.shape[0], config, null_vector.device)
    cached = None
    if reads_cached_states(config):
        # Reused only without autograd: a differentiable forward needs the graph through the prefix rows.
        reuse = reusable and not torch.is_grad_enabled()
        cached = cache.states(prefix, adapter, backbone, config.context_layers, reuse)
    return read_prefix(
        text,
        features["attention_mask"],
        prefix,
        cached,
        visible,
        adapter=adapter,
        backbone=backbone,
        config=config,
        gates=gates,
    )


def autocast_state(device: torch.device) -> tuple[bool, torch.dtype]:
    """Whether autocast is on for ``device``'s type, and its dtype: what the dtype of computed keys/values follows."""
    return torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)


def second_stage_fingerprint(backbone: nn.Module) -> torch.Tensor:
    """:func:`~cde_st.modules.freshness.values_fingerprint` of the second-stage weights behind cached
    keys/values (its layers; the input-embedding table is not used by the prefix rows)."""
    table = backbone.get_input_embeddings().weight
    return values_fingerprint([p for p in backbone.parameters() if p is not table])


class ContextKVCache:
    """Cached mode, inference: the prefix rows' per-layer keys/values, kept with the prefix and a fingerprint of the
    second stage they were computed with. Reused only for an equal prefix and (checked by the module once per
    encode call: :meth:`drop_if_stale`) unchanged second-stage weights."""

    def __init__(self) -> None:
        # (prefix, second-stage fingerprint, per-layer keys/values, autocast_state when computed)
        self.entry: tuple[torch.Tensor, torch.Tensor, list, tuple] | None = None

    def states(
        self,
        prefix: torch.Tensor,
        adapter: BackboneAdapter,
        backbone: nn.Module,
        layers: list[int] | None,
        reusable: bool,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (P, d) prefix's keys/values in every layer; computed anew unless ``reusable`` (then kept)."""
        if not reusable:
            return adapter.context_states(backbone, prefix, layers)
        entry, autocast = self.entry, autocast_state(prefix.device)
        # An exact comparison of the (P, d) prefix per batch: cheap next to the batch, and it sees every edit. The
        # keys/values' dtype follows autocast (bf16 under it): computed under another setting, they are recomputed.
        stale = entry is None or (entry[0].dtype, entry[0].device, entry[3]) != (prefix.dtype, prefix.device, autocast)
        if stale or not torch.equal(entry[0], prefix):
            with torch.no_grad():
                states = adapter.context_states(backbone, prefix, layers)
                self.entry = (prefix.detach().clone(), second_stage_fingerprint(backbone), states, autocast)
        return self.entry[2]

    def drop_if_stale(self, backbone: nn.Module) -> None:
        """Drop the keys/values if ``backbone``'s weights changed since they were computed."""
        if self.entry is not None and not torch.equal(self.entry[1], second_stage_fingerprint(backbone)):
            self.drop()

    def drop(self, *args, **kwargs) -> None:
        """Forget the keys/values (the arguments of a load_state_dict pre-hook are ignored)."""
        self.entry = None

    def nbytes(self) -> int:
        """Memory held by the keys/values (0 when nothing is cached)."""
        if self.entry is None:
            return 0
        return sum(t.numel() * t.element_size() for kv in self.entry[2] if kv is not None for t in kv)
