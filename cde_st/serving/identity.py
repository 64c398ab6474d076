"""Which model a stored context belongs to: a cheap fingerprint of the model's architecture and weights.

Context vectors are first-stage outputs of one set of weights; read by another model they are meaningless, and
nothing would say so (the embeddings just get worse). So each stored context records the identity of the model it
was made with, and the server refuses to load one whose identity differs. Hashing every weight of a large model
takes seconds, so the identity hashes the module configuration, every parameter's name and shape, and an evenly
strided sample of up to ``SAMPLE`` values of each parameter: a retrained or different checkpoint differs in
practically every tensor, hence in the sample. It is taken before any ``--dtype`` cast, so one model served in
float32 or bfloat16 keeps one identity.
"""

from __future__ import annotations

import hashlib
import json

import torch

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
def model_identity(model: torch.nn.Module) -> str:
    """A 16-hex-digit fingerprint of ``model``'s modules (class and config) and weights (names, shapes, sampled
    values, read as float32)."""
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
