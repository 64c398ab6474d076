"""A model loaded by name, contextual or not (:func:`load_model`), and the options that load it again as it runs
(:func:`load_options`).

Every command that takes a model by name loads it here: ``cde-st-eval``, ``cde-st-embed`` / ``cde-st-search``,
``cde-st-convert``, ``cde-st-serve`` and the vector stores, which record :func:`load_options` so a later reader loads
the same graph. It sits just above :mod:`cde_st.model`, below all of them, so that none imports another's package to
load a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download
from sentence_transformers import SentenceTransformer

from cde_st.backend_options import loading_kwargs
from cde_st.model import ContextualSentenceTransformer
from cde_st.released import ALIASES, is_released_checkpoint, resolve_name

__all__ = ["load_model", "load_options"]

#: sentence-transformers' list of a model's modules; a cde_st model names its own module types there.
_MODULES_FILE = "modules.json"


def load_model(
    name_or_path: str | Path, device: str | None = None, backend: str = "torch", onnx_file: str | None = None
) -> SentenceTransformer:
    """Load a sentence-transformers model from a folder, a hub id or a released model's short name, as what it
    holds: a model whose ``modules.json`` names a cde_st module, and the released CDE models (``jxm/cde-small-v2``,
    ``cde-small``, a local copy, ...), load as ``ContextualSentenceTransformer`` (no ``trust_remote_code``), anything
    else as a plain ``SentenceTransformer``. For a hub id only its ``modules.json`` is fetched to decide.
    ``backend``: sentence-transformers' argument ("onnx": a folder written by ``cde-st-convert --to onnx``);
    ``onnx_file``: which graph (``model_kwargs`` ``file_name``, e.g. ``second_stage_qint8.onnx``; default fp32).

    Raises:
        FileNotFoundError: a path-like name whose folder does not exist, a folder that is not a model, or a name that
            is neither a folder nor loadable from the hub (the hub's error chained, so an offline one is told apart).
        ValueError: a folder whose ``modules.json`` is not a JSON list of modules.
    """
    spec = str(name_or_path)
    name = resolve_name(spec)
    path = Path(name).expanduser()
    options = {"device": device, **loading_kwargs(backend, onnx_file)}
    if path.exists():
        modules = path / _MODULES_FILE
        if modules.is_file() and _names_cde_st_module(modules):
            return ContextualSentenceTransformer(str(path), **options)
        if is_released_checkpoint(str(path)):
            # a local copy of cde-small-v1/v2 (checked before the layout, so its loader names a missing file)
            return ContextualSentenceTransformer(str(path), **options)
        if not path.is_dir() or not (modules.is_file() or (path / "config.json").is_file()):
            raise FileNotFoundError(
                f"{path} is not a model folder (no {_MODULES_FILE} or config.json): give a saved sentence-transformers "
                "model folder or a hub id."
            )
        return SentenceTransformer(str(path), **options)
    if name in ALIASES.values():  # a released model by hub id or short name: native, no remote code
        return ContextualSentenceTransformer(name, **options)
    if spec.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise FileNotFoundError(f"Model folder {spec!r} does not exist (looked for {path.absolute()}).")
    try:
        if _hub_names_cde_st_module(name) or is_released_checkpoint(name):
            return ContextualSentenceTransformer(name, **options)
        return SentenceTransformer(name, **options)
    except Exception as err:  # hub errors come in many types; say what was tried
        raise FileNotFoundError(
            f"{spec!r} is not a local model folder and could not be loaded from the Hugging Face hub ({err})."
        ) from err


def _names_cde_st_module(modules_file: str | Path) -> bool:
    """Whether a ``modules.json`` names a cde_st module (a module ``type`` under ``cde_st``).

    Raises:
        ValueError: the file is not JSON, or not a list of modules.
    """
    modules_file = Path(modules_file)
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except ValueError as err:  # the module list is what loads the model: nothing else can be read without it
        raise ValueError(f"{modules_file} is not valid JSON ({err}); save the model again.") from err
    if not isinstance(modules, list):
        raise ValueError(f"{modules_file} is not a list of modules (it holds a {type(modules).__name__}).")
    types = (str(module.get("type", "")) for module in modules if isinstance(module, dict))
    return any(kind == "cde_st" or kind.startswith("cde_st.") for kind in types)


def _hub_names_cde_st_module(repo_id: str) -> bool:
    """Whether hub repo ``repo_id`` holds a cde_st model: only its ``modules.json`` is fetched. A repo without one
    (or one that cannot be fetched) is decided by the checks after this; a fetched one that does not parse is
    that repo's error."""
    try:
        modules_file = hf_hub_download(repo_id, _MODULES_FILE)
    except Exception:  # no modules.json (a plain transformers repo), or no hub: loading it says why
        return False
    return _names_cde_st_module(modules_file)


def load_options(model: Any) -> dict[str, Any]:
    """How :func:`load_model` loads ``model`` again as it runs now: ``backend`` and ``onnx_file`` (the graph a
    contextual model loaded with backend="onnx" runs; None otherwise)."""
    backend = model.get_backend() if hasattr(model, "get_backend") else "torch"
    runtime = getattr(model[0], "runtime", None) if len(model) else None
    return {"backend": backend, "onnx_file": None if runtime is None else runtime.file_name}
