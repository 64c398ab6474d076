"""How the second stage's text reads the context: one dispatch (:meth:`ContextAttention._attend`) over two paths.

- **joint** (``context_attention="joint"`` without a gate: the paper, and the released cde-small-v1/v2 modes; also
  any mode with no prefix row): ``[prefix ; text]`` runs through the HF encoder's own layers
  (:meth:`~cde_st.modules.backbone.BackboneAdapter.encode`), so the attention kernel is the encoder's
  ``attn_implementation`` (SDPA, eager or flash-attention 2). Prefix rows get rotary positions as
  ``prefix_positions`` says.
- **split** (``context_attention="cached"`` and/or ``context_gate=True``: cde_st's own modes): cde_st's layer
  attention (:meth:`~cde_st.modules.backbone.BackboneAdapter.encode_split`, reusing every weight of the pretrained
  layers), always through :func:`torch.nn.functional.scaled_dot_product_attention` whatever
  ``attn_implementation`` says. In cached mode the prefix rows attend only to each other, so their per-layer keys
  and values are computed once per context and kept (:meth:`ContextAttention._cached_states`) while the prefix
  and the second-stage weights stay the same.

The prefix is ``[context slots ; soft prompt]``; ``context_mask`` (per row, which context vectors it may read)
becomes a mask over every prefix slot (:meth:`ContextAttention._prefix_mask`).
"""

from __future__ import annotations

import torch

from cde_st.modules.backbone import NO_POSITION
from cde_st.modules.context_state import values_fingerprint


class ContextAttention:
    """The second stage's context attention of :class:`~cde_st.modules.ContextualTransformer` (a mixin: it uses
    the module's second stage and adapter, ``gates``, ``context_layers`` and the attention fields of its config)."""

    def _init_context_attention(self) -> None:
        # Cached mode, inference: (prefix rows, fingerprint of the second stage, per-layer keys/values). Reused only
        # for an equal prefix and (checked once per encode call, see _check_weights) unchanged second-stage weights.
        self._context_cache: tuple[torch.Tensor, torch.Tensor, list] | None = None
        self._register_load_state_dict_pre_hook(self._drop_context_cache)  # new weights: the cache is stale

    def _attend(
        self,
        prefix: torch.Tensor,
        num_ctx: int,
        text: torch.Tensor,
        attention_mask: torch.Tensor,
        prefix_mask: torch.Tensor | None,
        reusable: bool,
    ) -> torch.Tensor:
        """Encode (B, L, d) text embeddings against the (P, d) prefix (``num_ctx`` context slots, then the soft
        prompt) -> (B, L, d) text states. ``prefix_mask`` (B, P) or None: which prefix rows each text may read.
        ``reusable``: the prefix is the active context and nothing needs its gradient (cached keys/values may be
        kept and reused)."""
        adapter, backbone = self.second_adapter, self.second_stage
        batch, num_prefix = text.shape[0], prefix.shape[0]
        if self.config.split_attention and num_prefix > 0:
            cached = None
            if self.context_attention == "cached":
                # Reused only without autograd: a differentiable forward needs the graph through the prefix rows.
                cached = self._cached_states(prefix, reusable=reusable and not torch.is_grad_enabled())
            return adapter.encode_split(
                backbone, prefix, text, attention_mask, cached, self.gates, self.context_layers, prefix_mask
            )
        # joint attention; also the split modes with no prefix row (J = 0), which then read no context
        hidden = torch.cat([prefix.unsqueeze(0).expand(batch, -1, -1), text], dim=1)  # (B, P + L, d)
        if self.embed_joint_sequence:
            hidden = adapter.embed_sequence(backbone, hidden)
        if prefix_mask is None:
            prefix_mask = attention_mask.new_ones(batch, num_prefix)
        joint_mask = torch.cat([prefix_mask.to(attention_mask.dtype), attention_mask], dim=1)
        positions = self._position_ids(num_ctx, num_prefix, text.shape[1], text.device)
        out = adapter.encode(backbone, hidden, joint_mask, positions, num_prefix, self.local_attention_scope)
        return out[:, num_prefix:]

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

    def _position_ids(self, num_ctx: int, num_prefix: int, text_length: int, device) -> torch.Tensor:
        """One rotary position per row of [context ; soft prompt ; text] (NO_POSITION: no rotation)."""
        if self.prefix_positions == "none":
            prefix = torch.full((num_prefix,), NO_POSITION, dtype=torch.long, device=device)
            return torch.cat([prefix, torch.arange(text_length, device=device)])
        positions = torch.arange(num_prefix + text_length, device=device)
        if self.prefix_positions == "sequence_except_context":
            positions[:num_ctx] = NO_POSITION
        return positions

    # ------------------------------------------------------------------ the cached keys/values
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

    def _second_stage_fingerprint(self) -> torch.Tensor:
        """:func:`~cde_st.modules.context_state.values_fingerprint` of the second-stage weights behind the cached
        keys/values (its layers; the input-embedding table is not used by the prefix rows)."""
        table = self.second_stage.get_input_embeddings().weight
        return values_fingerprint([p for p in self.second_stage.parameters() if p is not table])

    def _drop_stale_context_cache(self) -> None:
        """Drop the cached keys/values if the second-stage weights changed since they were computed."""
        if self._context_cache is not None and not torch.equal(
            self._context_cache[1], self._second_stage_fingerprint()
        ):
            self._drop_context_cache()

    def _drop_context_cache(self, *args, **kwargs) -> None:
        self._context_cache = None

    def context_cache_bytes(self) -> int:
        """Memory held by the cached keys/values of the active context (0 when nothing is cached)."""
        if self._context_cache is None:
            return 0
        return sum(t.numel() * t.element_size() for kv in self._context_cache[2] if kv is not None for t in kv)
