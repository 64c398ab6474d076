"""The two HF encoders of a contextual model: which attention kernel they run, and how they are built (from a
saved config, or as two independent copies of a pretrained encoder)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as transformers_logging

from cde_st.modules.backbone import get_adapter


def resolve_attn_implementation(name: str | None) -> str:
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


def build_encoder(config: dict | Any, attn_implementation: str | None) -> PreTrainedModel:
    """A randomly initialised encoder from its config (a transformers config, or its dict with ``model_type``):
    the weights are loaded afterwards. An encoder given instead of a config is returned as it is."""
    if isinstance(config, PreTrainedModel):
        return config
    if isinstance(config, dict):
        config = dict(config)
        config = AutoConfig.for_model(config.pop("model_type"), **config)
    return AutoModel.from_config(
        config,
        attn_implementation=resolve_attn_implementation(attn_implementation),
        **get_adapter(config.model_type).model_kwargs,
    )


def load_pretrained_pair(
    model_dir: str, attn_implementation: str | None
) -> tuple[PreTrainedModel, PreTrainedModel, Any]:
    """Two independent copies of a pretrained HF encoder (the first and the second stage, not shared, as in the
    paper) and its tokenizer."""
    attn = resolve_attn_implementation(attn_implementation)
    family = get_adapter(AutoConfig.from_pretrained(model_dir).model_type).model_kwargs
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the dropped pooler is expected, not worth a load report
    try:
        first = AutoModel.from_pretrained(model_dir, attn_implementation=attn, **family)
        second = AutoModel.from_pretrained(model_dir, attn_implementation=attn, **family)
    finally:
        transformers_logging.set_verbosity(verbosity)
    for encoder in (first, second):
        own_storage(encoder)
    return first, second, AutoTokenizer.from_pretrained(model_dir)


def own_storage(model: nn.Module) -> None:
    """Give every parameter its own storage. Checkpoints in a packed layout (NomicBERT's ``Wqkv``) load as views of
    one tensor, which safetensors refuses to save."""
    for param in model.parameters():
        if param.untyped_storage().nbytes() != param.numel() * param.element_size():
            param.data = param.data.clone()
