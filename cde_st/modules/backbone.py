"""The context-injection seam: how a backbone embeds tokens and encodes a sequence with a prefix.

Everything model-family specific lives here. :class:`~cde_st.modules.ContextualTransformer` only asks a backbone
adapter two things: turn token ids into input vectors (with positions for the *text* only), and run the encoder
over ``[context vectors ; text vectors]`` with a joint padding mask. A rotary backbone (ModernBERT) needs its own
adapter (rotary angles for text positions only, none for the prefix) and nothing else changes.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.masking_utils import create_bidirectional_mask


class BackboneAdapter:
    """Interface of a backbone family. Stateless: the HF model is passed in on every call."""

    #: ``config.model_type`` values this adapter handles.
    model_types: tuple[str, ...] = ()

    def embed_tokens(
        self, model: PreTrainedModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, L) token ids -> (B, L, d) encoder inputs, text positions starting at 0."""
        raise NotImplementedError

    def input_norm(self, model: PreTrainedModel) -> torch.nn.Module | None:
        """The normalisation applied to M2's input embeddings, if any (to initialise the context head's norm)."""
        return None

    def encode(
        self, model: PreTrainedModel, hidden: torch.Tensor, attention_mask: torch.Tensor, num_prefix: int
    ) -> torch.Tensor:
        """Run the encoder layers over (B, P + L, d) inputs whose first ``num_prefix`` rows are position-free."""
        raise NotImplementedError


class BertAdapter(BackboneAdapter):
    """BERT-family absolute-position encoders (BERT, MiniLM, BGE, E5, GTE, RoBERTa, XLM-R, ELECTRA).

    Positions are added by ``model.embeddings`` to the text alone; the context vectors are concatenated *after*
    the embedding layer, so they carry no position and no token type: the encoder sees them as a set.
    """

    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")

    def embed_tokens(self, model, input_ids, token_type_ids):
        return model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)

    def input_norm(self, model):
        return getattr(model.embeddings, "LayerNorm", None)

    def encode(self, model, hidden, attention_mask, num_prefix):
        # A 2-D padding mask becomes whatever the configured attention implementation wants
        # (4-D additive mask for eager, boolean for SDPA, None/unpadding info for flash-attention).
        mask = create_bidirectional_mask(config=model.config, inputs_embeds=hidden, attention_mask=attention_mask)
        return model.encoder(hidden, attention_mask=mask).last_hidden_state


_ADAPTERS: list[BackboneAdapter] = [BertAdapter()]


def get_adapter(model_type: str) -> BackboneAdapter:
    """The adapter for a HF ``config.model_type``; a clear error for unsupported families."""
    for adapter in _ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    supported = sorted(t for a in _ADAPTERS for t in a.model_types)
    raise ValueError(
        f"Backbone type {model_type!r} is not supported yet; supported: {supported}. "
        "Add a BackboneAdapter in cde_st/modules/backbone.py for it."
    )
