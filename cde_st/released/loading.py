"""Loading a released CDE model (:func:`load_released`): its files, its backbone config and tokenizer (which the
released repos do not ship), the module built in its released-compatible mode, and the weights mapped into it once
they fit it whole. No remote code runs."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import AutoTokenizer

from cde_st.modules.contextual_transformer import ContextualTransformer
from cde_st.modules.integrity import STAGES, check_finite, check_state_dict, check_tokenizer, tokenizer_source
from cde_st.modules.loading_options import resolve_dtype, split_model_kwargs
from cde_st.released.configs import backbone_from_raw, check_backbone_config, module_config
from cde_st.released.hub import (
    BACKBONE_CONFIG_FILE,
    CONFIG_FILE,
    TOKENIZER_FILES,
    WEIGHTS_FILE,
    ReleasedCheckpointError,
    fetch,
    is_released_config,
    read_json,
    resolve_name,
)
from cde_st.released.weights import convert_state_dict

__all__ = ["load_released"]


def load_released(
    name_or_path: str,
    backbone_config: str | dict | None = None,
    tokenizer: Any = None,
    revision: str | None = None,
    cache_folder: str | None = None,
    token: bool | str | None = None,
    local_files_only: bool = False,
    model_kwargs: dict[str, Any] | None = None,
) -> ContextualTransformer:
    """Build the :class:`ContextualTransformer` of a released CDE model with its weights.

    Args:
        name_or_path: ``jxm/cde-small-v2`` / ``jxm/cde-small-v1`` (or ``cde-small``, ``cde-small-v1``,
            ``cde-small-v2``), another hub repo in the released layout, or a local folder holding its files.
        backbone_config: the backbone's config (a dict, a JSON file or a folder with ``config.json``). Default:
            ``backbone_config.json`` in the local folder if there is one, else the ``embedder`` repo's config.
        tokenizer: a tokenizer object or a tokenizer name/folder. Default: tokenizer files in the local folder if
            there are any, else the ``embedder`` repo's tokenizer (the released repos ship none).
        model_kwargs: as for a native folder: ``dtype`` (or ``torch_dtype``; "auto": the dtype in ``config.json``)
            and ``attn_implementation`` apply to both encoders; other keys are ignored with a warning.

    The folder must load whole: tensors named and shaped as the backbone config says, all finite, and a tokenizer
    that fits the embedding tables (a :class:`ReleasedCheckpointError` names what does not).

    Example:
        >>> module = load_released("jxm/cde-small-v2")                      # doctest: +SKIP
    """
    name = resolve_name(name_or_path)
    dtype, attn_implementation = split_model_kwargs(model_kwargs, "load_released")
    hub = dict(revision=revision, cache_folder=cache_folder, token=token, local_files_only=local_files_only)
    cde = read_json(fetch(name, CONFIG_FILE, **hub))
    if not is_released_config(cde):
        raise ReleasedCheckpointError(
            f"{name}/{CONFIG_FILE} has no transductive_corpus_size/embedder fields: not a released CDE model."
        )
    dtype = resolve_dtype(dtype, cde)  # "auto": the dtype config.json records
    folder = Path(name).expanduser() if Path(name).expanduser().is_dir() else None
    backbone_hub = dict(cache_folder=cache_folder, token=token, local_files_only=local_files_only)
    raw, config_source = _released_backbone_config(name, cde["embedder"], folder, backbone_config, backbone_hub)
    check_backbone_config(raw, cde["embedder"], config_source)
    config = backbone_from_raw(raw, config_source)
    tokenizer, token_source = _released_tokenizer(name, cde["embedder"], folder, tokenizer, backbone_hub)

    settings = module_config(cde, config.model_type, source=_source_name(name, CONFIG_FILE))
    if attn_implementation is not None:
        settings = dataclasses.replace(settings, attn_implementation=attn_implementation)
    weights_path = fetch(name, WEIGHTS_FILE, **hub)
    module = _released_module(name, config, config_source, tokenizer, token_source, settings, weights_path)
    if dtype is not None:
        module.to(dtype)
    module.eval()
    # Where each part came from: a backbone config or tokenizer from beside the files or an argument is not checked
    # against the embedder's (see check_backbone_config), so a conversion names them.
    module.released_sources = {
        "config": _source_name(name, CONFIG_FILE),
        "weights": str(weights_path),
        "backbone config": str(config_source),
        "tokenizer": str(token_source),
    }
    return module


def _released_backbone_config(
    name: str, embedder: str, folder: Path | None, backbone_config: str | dict | None, backbone_hub: dict[str, Any]
) -> tuple[dict, str]:
    """The backbone's raw config and where it came from: the argument, the file beside the released files, or the
    ``embedder`` repo's ``config.json``."""
    if isinstance(backbone_config, dict):
        return backbone_config, "the backbone_config= dict"
    if backbone_config is not None:
        path = Path(backbone_config).expanduser()
        config_source = str(path / "config.json" if path.is_dir() else path)
        return read_json(config_source), config_source
    if folder is not None and (folder / BACKBONE_CONFIG_FILE).is_file():
        config_source = str(folder / BACKBONE_CONFIG_FILE)
        return read_json(config_source), config_source
    try:
        config_source = fetch(embedder, CONFIG_FILE, **backbone_hub)
        return read_json(config_source), config_source
    except ReleasedCheckpointError as err:
        raise ReleasedCheckpointError(
            f"The backbone config of {name} (its `embedder`, {embedder!r}) is not available: {err} "
            f"Put the backbone's config.json beside the released files as {BACKBONE_CONFIG_FILE}, or pass "
            "backbone_config=."
        ) from err


def _released_tokenizer(
    name: str, embedder: str, folder: Path | None, tokenizer: Any, backbone_hub: dict[str, Any]
) -> tuple[Any, str]:
    """The tokenizer (the argument, the files beside the released files, or the ``embedder`` repo's) and where it
    came from."""
    if tokenizer is None:
        if folder is not None and any((folder / f).is_file() for f in TOKENIZER_FILES):
            tokenizer = str(folder)
        else:
            tokenizer = embedder
    token_source = "the tokenizer= object"
    if isinstance(tokenizer, (str, os.PathLike)):
        local = Path(tokenizer).expanduser()
        token_source = tokenizer_source(str(local)) if local.is_dir() else repr(str(tokenizer))
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), **_tokenizer_hub(backbone_hub))
        except Exception as err:
            raise ReleasedCheckpointError(
                f"The tokenizer of {name} ({tokenizer!r}; the released repos ship none) could not be loaded: {err}. "
                "Pass tokenizer= (a folder or name), or put the tokenizer files beside the released files."
            ) from err
    return tokenizer, token_source


def _released_module(
    name: str,
    config: Any,
    config_source: str,
    tokenizer: Any,
    token_source: str,
    settings: Any,
    weights_path: str,
) -> ContextualTransformer:
    """The module built from the backbone config and loaded with the released weights, once they fit it whole."""
    try:
        reference = load_file(weights_path)
    except Exception as err:
        raise ReleasedCheckpointError(f"{weights_path} could not be read as safetensors: {err}") from err
    try:
        module = ContextualTransformer(config, copy.deepcopy(config), tokenizer, settings)
    except (ValueError, TypeError) as err:  # e.g. an attention implementation that cannot run these settings
        raise ReleasedCheckpointError(f"{name} (backbone config {config_source}): {err}") from None
    module.attn_implementation = "sdpa"  # a load-time choice: a converted folder records the released setting
    state = convert_state_dict(reference, config.model_type)
    try:
        # null_vector is cde_st's own slot filler: the releases have none (tiled contexts never need it)
        shapes = {key: tuple(t.shape) for key, t in state.items()}
        source = f"the {config.model_type} config ({config_source})"
        check_state_dict(module, shapes, weights_path, source, ignore={"null_vector"})
        tables = {stage: getattr(module, stage).get_input_embeddings().num_embeddings for stage in STAGES}
        check_tokenizer(tokenizer, tables, token_source, weights_path)
        module.load_state_dict(state, strict=False)
        check_finite(module, weights_path)
    except ValueError as err:
        raise ReleasedCheckpointError(str(err)) from None
    return module


def _source_name(name: str, filename: str) -> str:
    folder = Path(name).expanduser()
    return str(folder / filename) if folder.is_dir() else f"{filename} of {name!r}"


def _tokenizer_hub(hub: dict) -> dict:
    # trust_remote_code=False: a released folder's config.json names remote code (auto_map), which must never run
    # (and must not make transformers prompt on stdin) just to read a tokenizer.
    return {
        "cache_dir": hub["cache_folder"],
        "token": hub["token"],
        "local_files_only": hub["local_files_only"],
        "trust_remote_code": False,
    }
