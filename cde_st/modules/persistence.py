"""Saving a :class:`~cde_st.modules.contextual_transformer.ContextualTransformer` to a folder and loading it back.

A saved module is a folder of: ``cde_config.json`` (the :class:`ContextualConfig`, both encoder configs, the
active context's info), ``model.safetensors`` (the weights, with the encoder configs and tokenizer size in its
metadata), the tokenizer files, ``context.safetensors`` (the active context, if any) and last ``cde_st_save.json``
(the record of what this save wrote). Loading checks every file against the others (:mod:`cde_st.modules.integrity`), so a folder
that is incomplete or mixed from two saves is an error that names the file, never wrong embeddings.

The module's ``save`` and ``load`` (sentence-transformers' hooks) call :func:`save_module` and :func:`load_module`;
both work through the module's public methods (the constructor, ``save_config``, ``save_context``,
``restore_context``), so the module's own file keeps the encoder and its context lifecycle (whose steps are
functions of ``context_lifecycle.py``, which work the same way).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from safetensors.torch import save_model
from sentence_transformers.util import load_file_path
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cde_st.atomic_files import write_path_atomically
from cde_st.modules.context_state import CONTEXT_FILE, read_context_file
from cde_st.modules.contextual_config import CONFIG_FILE, ContextualConfig, legacy_prompts, read_config_file
from cde_st.modules.integrity import (
    STAGES,
    WEIGHTS_NAMES,
    check_manifest,
    load_checked_weights,
    save_metadata,
    tokenizer_source,
    write_manifest,
)
from cde_st.modules.loading_options import check_backend, resolve_dtype, split_model_kwargs
from cde_st.modules.onnx_runtime import OnnxRuntime, onnx_runtime_options

__all__ = [
    "build_module",
    "config_dict",
    "load_module",
    "load_tokenizer",
    "save_module",
    "saved_tokenizer_files",
    "warn_if_plain_model",
]


def config_dict(module: nn.Module) -> dict[str, Any]:
    """``cde_config.json`` of ``module``: its :class:`ContextualConfig`, both encoder configs, the active context's
    info."""
    config = module.config.to_dict()
    for stage in STAGES:
        encoder_config = getattr(module, stage).config
        config[f"{stage}_config"] = encoder_config.to_diff_dict() | {"model_type": encoder_config.model_type}
    config["context_info"] = module.context_info.to_dict() if module.context_info is not None else None
    return config


def save_module(module: nn.Module, output_path: str, safe_serialization: bool = True) -> None:
    """Write ``module`` (a ContextualTransformer) to ``output_path``: config, weights, tokenizer, context, and last
    the record of this save (``cde_st_save.json``), which load checks so that files of two saves are never mixed."""
    os.makedirs(output_path, exist_ok=True)
    module.save_config(output_path)
    if safe_serialization:
        # The metadata records what the weights go with (encoder configs, tokenizer size), checked on load.
        stages = {stage: getattr(module, stage).config for stage in STAGES}
        metadata = save_metadata(stages, module.tokenizer)
        # safetensors writes 0o600 files: written atomically with the umask's mode, others can load them too
        write_path_atomically(
            os.path.join(output_path, WEIGHTS_NAMES[0]),
            lambda path: save_model(module, path, metadata=metadata),
            fsync=False,
        )
        written = [WEIGHTS_NAMES[0]]
    else:
        module.save_torch_weights(output_path, safe_serialization=False)
        written = [WEIGHTS_NAMES[1]]
    if isinstance(module.tokenizer, PreTrainedTokenizerBase):
        written += saved_tokenizer_files(module.tokenizer, output_path)
    else:
        module.save_tokenizer(output_path)
    module.save_context(output_path)
    if module.context_vectors is not None:
        written.append(CONTEXT_FILE)
    write_manifest(output_path, written)


def saved_tokenizer_files(tokenizer: PreTrainedTokenizerBase, output_path: str) -> list[str]:
    """Save ``tokenizer``; the names of the files it wrote in ``output_path`` itself."""
    paths = tokenizer.save_pretrained(output_path)
    folder = os.path.abspath(output_path)
    return [
        os.path.basename(path)
        for path in paths
        if os.path.isfile(path) and os.path.dirname(os.path.abspath(path)) == folder
    ]


def load_module(
    cls: type,
    model_name_or_path: str,
    subfolder: str = "",
    token: bool | str | None = None,
    cache_folder: str | None = None,
    revision: str | None = None,
    local_files_only: bool = False,
    backend: str = "torch",
    model_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Build a ``cls`` (ContextualTransformer) from the saved folder ``model_name_or_path`` and check it whole.

    Of sentence-transformers' loading options (the arguments its loader passes to a module's ``load``), the file
    lookup ones apply; ``model_kwargs`` ``dtype`` (or ``torch_dtype``; "auto": the saved dtype) and
    ``attn_implementation`` apply to both encoders; other ``model_kwargs``, ``config_kwargs`` and
    ``processor_kwargs`` are ignored with a warning. ``backend="onnx"``: the folder's exported graphs run the
    two stages (:class:`~cde_st.modules.onnx_runtime.OnnxRuntime`; ``model_kwargs`` ``file_name``, ``provider``,
    ``session_options`` go to it).

    The folder must be whole (:mod:`cde_st.modules.integrity`): a tokenizer that fits the embedding tables, weights
    named and shaped as ``cde_config.json`` says and saved with the same encoder configs, no NaN/inf, files of one
    save. Anything else is a ValueError (or FileNotFoundError) naming the folder, the file and the field."""
    check_backend(backend)
    runtime_options = {}
    if backend == "onnx":
        runtime_options, model_kwargs = onnx_runtime_options(model_kwargs)
    dtype, attn_implementation = split_model_kwargs(model_kwargs, "ContextualTransformer.load", stacklevel=4, **kwargs)
    hub = dict(
        subfolder=subfolder,
        token=token,
        cache_folder=cache_folder,
        revision=revision,
        local_files_only=local_files_only,
    )

    def find(name: str) -> str | None:
        return load_file_path(model_name_or_path, name, **hub)

    config_path = _config_path(find, model_name_or_path, subfolder)
    saved = read_config_file(config_path)
    dtype = resolve_dtype(dtype, saved["second_stage_config"])
    tokenizer_dir = cls.load_dir_path(model_name_or_path, **hub)
    module = build_module(cls, saved, load_tokenizer(tokenizer_dir), config_path, attn_implementation)
    weights = find("model.safetensors") or find("pytorch_model.bin")
    load_checked_weights(module, weights, config_path, tokenizer_dir)
    if dtype is not None:
        module.to(dtype)  # before the context is restored: the saved context vectors stay float32
    context_used = _restore_context(module, find, os.path.join(model_name_or_path, subfolder), saved, config_path)
    # Last, once each file has passed its own checks: the files were written together by one save.
    check_manifest(find, [os.path.basename(weights), *context_used])
    if backend == "onnx":
        if dtype is not None:
            raise ValueError("model_kwargs dtype does not apply to backend='onnx': the exported graphs are float32.")
        module.runtime = OnnxRuntime.open(tokenizer_dir, module, **runtime_options)
        module.eval()  # the graphs have no training mode
    return module


def _config_path(find: Callable[[str], str | None], model_name_or_path: str, subfolder: str) -> str:
    """The folder's ``cde_config.json``, or an error that says why there is none to read (a folder the user may
    not read is told apart from one that is no cde_st model)."""
    config_path = find(CONFIG_FILE)
    folder = os.path.join(model_name_or_path, subfolder)
    if config_path is None and os.path.isdir(folder) and not os.access(folder, os.R_OK | os.X_OK):
        raise PermissionError(
            f"The model folder {folder} cannot be read: permission denied. Ask its owner to make it readable "
            "(chmod a+rX), or load a copy you can read."
        )
    if config_path is None:
        raise FileNotFoundError(f"No {CONFIG_FILE} in {model_name_or_path!r}: not a cde_st model.")
    return config_path


def _restore_context(
    module: Any, find: Callable[[str], str | None], folder: str, saved: dict[str, Any], config_path: str
) -> list[str]:
    """Make the saved context (checked against ``cde_config.json``'s ``context_info``) the module's active context;
    the file names the save's record must list for it (none without a saved context)."""
    context_path = find(CONTEXT_FILE)
    expected_path = os.path.join(folder, CONTEXT_FILE)
    context_info = saved.get("context_info")
    validate = module.validate_context_vectors
    restored = read_context_file(
        context_path or expected_path, context_path is not None, context_info, config_path, validate
    )
    if restored is not None:
        module.restore_context((*restored, None))  # (vectors, info, texts) of the current weights
    return [CONTEXT_FILE] if context_path is not None and context_info is not None else []


def load_tokenizer(tokenizer_dir: str) -> PreTrainedTokenizerBase:
    """The saved tokenizer, or a ValueError that says which files to put back."""
    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(
            f"The tokenizer of {tokenizer_source(tokenizer_dir)} cannot be loaded ({type(exc).__name__}: {exc}). "
            "Put the tokenizer files the model was saved with (tokenizer.json, tokenizer_config.json) back "
            "beside the weights, or save the model again."
        ) from None


def build_module(
    cls: type, saved: dict[str, Any], tokenizer: Any, config_path: str, attn_implementation: str | None
) -> Any:
    """A ``cls`` with untrained weights, built from the saved ``cde_config.json`` (``saved``)."""
    try:
        config = ContextualConfig.from_dict(saved)
        # A load-time choice (like transformers' attn_implementation): a later save keeps the saved value.
        built_with = config.attn_implementation if attn_implementation is None else attn_implementation
        first, second = saved["first_stage_config"], saved["second_stage_config"]
        module = cls(first, second, tokenizer, config, attn_implementation=built_with, **legacy_prompts(saved))
    except (ValueError, TypeError) as exc:  # a field of the wrong type or value
        raise ValueError(f"{config_path}: {exc}") from None
    module.attn_implementation = config.attn_implementation
    return module


def warn_if_plain_model(loaded_from: str | None, model: Any) -> None:
    """A folder loaded by plain ``SentenceTransformer(path, trust_remote_code=True)`` (the advice of
    sentence-transformers' error) would otherwise load without a word: say which call loads it as a contextual
    model. ``loaded_from``: the folder, only for the model a folder is loaded into (a client that later wraps the
    modules of a ContextualSentenceTransformer, LangChain or LlamaIndex, does so on purpose)."""
    if loaded_from is not None and not hasattr(model, "set_context"):
        warnings.warn(
            f"{loaded_from} is a cde_st model loaded into a plain {type(model).__name__}, which has no "
            "set_context(); with trust_remote_code=True, sentence-transformers would also import a cde_st.py "
            "found in the folder instead of the installed cde_st. Load it with "
            "cde_st.ContextualSentenceTransformer(path) (no trust_remote_code needed); for this model object, "
            "cde_st.set_context(model, corpus_texts) sets the context.",
            UserWarning,
            stacklevel=3,
        )
