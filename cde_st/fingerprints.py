"""Which model made a vector: the one model fingerprint that stored contexts, embedded corpora and vector stores record.

Context vectors and corpus embeddings are outputs of one set of weights; read by another model they are meaningless,
and nothing would say so (the results just get worse). So what is stored records the fingerprint of the model that
made it, and a reader refuses a model of another fingerprint. Hashing every weight of a large model takes seconds,
so the fingerprint hashes the module configuration, every parameter's name and shape, and an evenly strided sample
of up to ``SAMPLE`` values of each parameter: a retrained or different checkpoint differs in practically every
tensor, hence in the sample. It is taken before any ``--dtype`` cast (values are read as float32), so one model
served in float32 or bfloat16 keeps one fingerprint.

A contextual module's config records its active context, so the fingerprint comes in two kinds:
``with_context=True`` (what ``cde-st-serve`` records in a stored context: the model as it is loaded, its saved
context included) and ``with_context=False`` (what an embedded corpus records: its context has a fingerprint of its
own, so the model's is taken with no context active, and the active one is put back after).

Two other rules stay where they serve, under their own names, because they answer other questions:
``cde_st.batching.cache.embedding_cache_key`` (every weight byte and the active context: a cache must never reuse
embeddings of other inputs) and ``cde_st.evaluation.models.weights_revision`` (every weight byte: result revisions).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from cde_st.model import contextual_module, is_contextual

__all__ = ["SAMPLE", "model_fingerprint"]

SAMPLE = 256


def _module_description(model: torch.nn.Module) -> list:
    described = []
    for module in model.children() if hasattr(model, "children") else []:
        config = {}
        get_config = getattr(module, "get_config_dict", None)
        if callable(get_config):
            try:
                config = get_config()
            except Exception:  # a module without a serialisable config is still described by its class
                config = {}
        runtime = getattr(module, "runtime", None)  # exported graphs in place of torch (backend="onnx")
        if runtime is not None:
            config = {**config, "runtime": runtime.identity}
        described.append([type(module).__module__ + "." + type(module).__name__, config])
    return described


@torch.no_grad()
def _sampled_fingerprint(model: torch.nn.Module) -> str:
    h = hashlib.sha256(json.dumps(_module_description(model), sort_keys=True, default=str).encode("utf-8"))
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode("utf-8"))
        h.update(str(tuple(tensor.shape)).encode("utf-8"))
        flat = tensor.detach().reshape(-1)
        if flat.numel() == 0:
            continue
        step = max(1, flat.numel() // SAMPLE)
        sample = flat[::step][:SAMPLE]
        sample = sample.float() if sample.is_floating_point() else sample.to(torch.int64)
        h.update(sample.cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def model_fingerprint(model: Any, *, with_context: bool = True) -> str:
    """A 16-hex-digit fingerprint of ``model``'s modules (class and config) and weights (names, shapes, sampled
    values, read as float32); with ``with_context=False`` taken with no context active (see the module docstring)."""
    if with_context or not is_contextual(model):
        return _sampled_fingerprint(model)
    module = contextual_module(model)
    snapshot = module.context_snapshot()
    try:
        module.clear_context()
        return _sampled_fingerprint(model)
    finally:
        module.restore_context(snapshot)
