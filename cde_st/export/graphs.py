"""The torch functions an ONNX export traces: a contextual module's first stage and second stage as plain modules
over tensors, built from the module's own code (so the graphs compute what torch computes, and nothing else).

- :class:`FirstStageGraph`: token ids of context documents -> context vectors (the first stage, mean pooling and
  the context head: ``ContextualTransformer.embed_context_features``).
- :class:`SecondStageGraph`: token ids and the corpus context -> text states (the second stage's layers:
  :func:`~cde_st.modules.context_attention.read_prefix`). The context is the ``(P, d)`` prefix, or in cached mode
  the prefix's per-layer keys/values stacked ``(R, 2, heads, P, head_dim)`` over the R layers that read them.

Pooling, the output head and normalisation stay outside the graphs (cheap, and they read per-call options such
as the prompt length).
"""

from __future__ import annotations

from torch import nn

from cde_st.modules.context_attention import embed_text, read_prefix, reads_cached_states

__all__ = ["FirstStageGraph", "SecondStageGraph"]


class FirstStageGraph(nn.Module):
    """``(input_ids, attention_mask[, token_type_ids]) -> (n, d)`` context vectors of ``module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return self.module.embed_context_features(features)


class SecondStageGraph(nn.Module):
    """``(input_ids, attention_mask, context[, token_type_ids]) -> (B, L, d)`` text states of ``module``, the
    ``context`` being the prefix or (:attr:`reads_states`) its stacked keys/values (see the module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.reads_states = reads_cached_states(module.config)
        layers = module.config.context_layers
        self.layers = list(range(module.second_stage.config.num_hidden_layers)) if layers is None else list(layers)

    def forward(self, input_ids, attention_mask, context, token_type_ids=None):
        module = self.module
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        parts = dict(adapter=module.second_adapter, backbone=module.second_stage, config=module.config)
        text = embed_text(features, **parts)
        if not self.reads_states:
            return read_prefix(text, attention_mask, context, None, None, gates=module.gates, **parts)
        cached = [None] * module.second_stage.config.num_hidden_layers
        for row, layer in enumerate(self.layers):
            cached[layer] = (context[row, 0].unsqueeze(0), context[row, 1].unsqueeze(0))
        return read_prefix(text, attention_mask, None, cached, None, gates=module.gates, **parts)
