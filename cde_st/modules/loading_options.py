"""The sentence-transformers loading options a contextual model honours (``backend``, ``model_kwargs``), checked
and turned into what the module applies: a dtype and an attention implementation. One home for both loading routes
(a saved cde_st folder, :meth:`~cde_st.modules.ContextualTransformer.load`; a released checkpoint,
:func:`cde_st.released.load_released`)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def check_backend(backend: str, released: bool = False) -> None:
    """A contextual model runs on PyTorch, or (``backend="onnx"``) on the graphs of a folder exported with
    ``cde-st-convert --to onnx`` (:mod:`cde_st.modules.onnx_runtime`); OpenVINO and released checkpoints (not yet
    converted and exported) are refused with the way to get there."""
    if backend == "torch" or (backend == "onnx" and not released):
        return
    if backend == "onnx":
        raise ValueError(
            "backend='onnx' loads a folder exported with `cde-st-convert MODEL OUT --to onnx`; a released checkpoint "
            "is not one: export it first (cde-st-convert cde-small OUT --to onnx), then load OUT."
        )
    raise ValueError(
        f"backend={backend!r} is not supported for contextual (cde_st) models: use backend='torch' (the default) or "
        "backend='onnx' with a folder exported by `cde-st-convert MODEL OUT --to onnx`."
    )


def resolve_dtype(value: Any, encoder_config: dict) -> torch.dtype | None:
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
