"""The released weights' parameter names (the research code's) mapped onto :class:`ContextualTransformer`'s,
NomicBERT's contrastors names onto transformers' ``NomicBertModel`` on the way."""

from __future__ import annotations

import torch

from cde_st.released.hub import ReleasedCheckpointError

__all__ = ["convert_state_dict"]


def _nomic_name(name: str) -> str:
    """A contrastors NomicBERT parameter name -> transformers' ``NomicBertModel`` name (Wqkv handled apart)."""
    for old, new in (
        ("encoder.layers.", "layers."),
        ("emb_ln.", "embeddings.LayerNorm."),
        ("attn.out_proj.", "self_attn.o_proj."),
        ("mlp.fc11.", "mlp.up_proj."),
        ("mlp.fc12.", "mlp.gate_proj."),
        ("mlp.fc2.", "mlp.down_proj."),
        ("norm1.", "post_attention_layernorm."),
        ("norm2.", "post_mlp_layernorm."),
    ):
        name = name.replace(old, new)
    return name


def _backbone_tensors(prefix: str, tensors: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        if model_type == "nomic_bert" and name.endswith("attn.Wqkv.weight"):
            # rows packed [q; k; v], heads contiguous within each
            base = _nomic_name(name[: -len("attn.Wqkv.weight")])
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
                out[f"{prefix}{base}self_attn.{part}.weight"] = chunk
        else:
            out[prefix + (_nomic_name(name) if model_type == "nomic_bert" else name)] = tensor
    return out


def convert_state_dict(reference: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """The research code's ``state_dict`` names -> :class:`ContextualTransformer`'s."""
    groups: dict[str, dict[str, torch.Tensor]] = {"first": {}, "second": {}}
    out: dict[str, torch.Tensor] = {}
    heads = {
        "first_stage_model.mlp.0.": "context_head.fc1.",
        "first_stage_model.mlp.2.": "context_head.fc2.",
        "second_stage_model.output_projection.0.": "head.fc1.",
        "second_stage_model.output_projection.2.": "head.fc2.",
        "second_stage_model.prompt_projection.": "soft_prompt.projection.",
    }
    unknown = []
    for name, tensor in reference.items():
        if name.startswith("first_stage_model.embedder."):
            groups["first"][name[len("first_stage_model.embedder.") :]] = tensor
        elif name.startswith("second_stage_model.backbone."):
            groups["second"][name[len("second_stage_model.backbone.") :]] = tensor
        else:
            head = next((h for h in heads if name.startswith(h)), None)
            if head is None:
                unknown.append(name)
            else:
                out[heads[head] + name[len(head) :]] = tensor
    if unknown:
        raise ReleasedCheckpointError(f"Unexpected parameters in the released weights: {unknown[:8]}")
    out.update(_backbone_tensors("first_stage.", groups["first"], model_type))
    out.update(_backbone_tensors("second_stage.", groups["second"], model_type))
    return out
