"""A model loaded by name, contextual or not (:func:`load_model`), and the options that load it again as it runs
(:func:`load_options`).

Every command that takes a model by name loads it here: ``cde-st-eval``, ``cde-st-embed`` / ``cde-st-search``,
``cde-st-convert`` and the vector stores, which record :func:`load_options` so a later reader loads the same graph.
It sits just above :mod:`cde_st.model`, below all of them, so that none imports another's package to load a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer

from cde_st.backend_options import loading_kwargs
from cde_st.model import ContextualSentenceTransformer
from cde_st.released import is_released_checkpoint

__all__ = ["load_model", "load_options"]


def load_model(
    name_or_path: str | Path, device: str | None = None, backend: str = "torch", onnx_file: str | None = None
):
    """Load a sentence-transformers model from a folder or a hub id; CDE folders and the released CDE models
    (``jxm/cde-small-v2``, ``cde-small``, ...) load as ``ContextualSentenceTransformer`` (no ``trust_remote_code``).
    ``backend``: sentence-transformers' argument ("onnx": a folder written by ``cde-st-convert --to onnx``);
    ``onnx_file``: which graph (``model_kwargs`` ``file_name``, e.g. ``second_stage_qint8.onnx``; default fp32).

    Raises:
        FileNotFoundError: a path-like name whose folder does not exist, or a folder that is not a model.
    """
    spec = str(name_or_path)
    path = Path(spec).expanduser()
    options = {"device": device, **loading_kwargs(backend, onnx_file)}
    if is_released_checkpoint(spec):
        # cde-small-v1/v2 (hub id, short name or a local copy of the released files): native, no remote code
        return ContextualSentenceTransformer(spec, **options)
    if path.exists():
        if not path.is_dir() or not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise FileNotFoundError(
                f"{path} is not a model folder (no modules.json or config.json): give a saved sentence-transformers "
                "model folder or a hub id."
            )
        modules = path / "modules.json"
        if modules.is_file() and "cde_st" in modules.read_text(encoding="utf-8"):
            return ContextualSentenceTransformer(str(path), **options)
        return SentenceTransformer(str(path), **options)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
    if looks_like_path:
        raise FileNotFoundError(f"Model folder {path} does not exist.")
    try:
        return SentenceTransformer(spec, **options)
    except Exception as err:  # hub errors come in many types; say what was tried
        raise FileNotFoundError(
            f"{spec!r} is not a local model folder and could not be loaded from the Hugging Face hub ({err})."
        ) from err


def load_options(model: Any) -> dict[str, Any]:
    """How :func:`load_model` loads ``model`` again as it runs now: ``backend`` and ``onnx_file`` (the graph a
    contextual model loaded with backend="onnx" runs; None otherwise)."""
    backend = model.get_backend() if hasattr(model, "get_backend") else "torch"
    runtime = getattr(model[0], "runtime", None) if len(model) else None
    return {"backend": backend, "onnx_file": None if runtime is None else runtime.file_name}
