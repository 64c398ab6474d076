"""The released CDE checkpoints (``jxm/cde-small-v1``, ``jxm/cde-small-v2``) as native cde_st modules.

A released repo holds a ``config.json`` with the CDE fields (``transductive_corpus_size``, ``embedder``, ...) and a
``model.safetensors`` with the research code's parameter names; it ships no backbone config and no tokenizer (the
remote code fetched both from the ``embedder`` repo at construction time). :func:`load_released` reads those files
(local folder, or the Hugging Face cache/download), builds a :class:`~cde_st.modules.ContextualTransformer` in its
released-compatible mode and maps the weights into it. No remote code runs.

What each release does differently, and which fields reproduce it (see the parity fixture's README):

============================  =====================================  =====================================
fact                          cde-small-v1 (NomicBERT)               cde-small-v2 (ModernBERT)
============================  =====================================  =====================================
soft prompt                   8 vectors after the context            8 vectors after the context
rotary positions              text/prompt count along the joint      every row counts along the joint
                              sequence; context rows unrotated       sequence (context order matters)
joint sequence re-embedded    text gets token_type[0] twice          text is LayerNormed twice
sliding-window layers         (none)                                 window over the joint sequence
pooling                       all text tokens                        skips the instruction up to ": "
output head                   Linear-ReLU-Linear                     the same plus a residual
============================  =====================================  =====================================

cde-small-v1 and rotary: the research repository's ``hf_model.py`` rotates queries and keys along the *head* axis,
so its rotation cancels in q.k and that file has no positions at all. NomicBERT's own code and the CDE training
code rotate along the sequence, which is what the model was trained with; cde_st implements the sequence rotation
(the fixture's ``counterfactual_seq_rotary`` outputs), not the bug.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file
from transformers import AutoTokenizer, ModernBertConfig, NomicBertConfig

from cde_st.coercion import ConfigValueError, coerce
from cde_st.modules.contextual_config import ContextualConfig
from cde_st.modules.contextual_transformer import ContextualTransformer
from cde_st.modules.integrity import STAGES, check_finite, check_state_dict, check_tokenizer, tokenizer_source
from cde_st.modules.loading_options import resolve_dtype, split_model_kwargs
from cde_st.prompts import DEFAULT_PROMPTS

#: Short names a user may type for the released models.
ALIASES = {
    "cde-small": "jxm/cde-small-v2",
    "cde-small-v1": "jxm/cde-small-v1",
    "cde-small-v2": "jxm/cde-small-v2",
}
#: The prompts the released models were trained with (cde_st's defaults are these).
PROMPTS = dict(DEFAULT_PROMPTS)
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: Beside the released files, a folder may hold the backbone's config (the parity fixtures do).
BACKBONE_CONFIG_FILE = "backbone_config.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
#: The soft prompt length is hard-coded in the released code.
_SOFT_PROMPT_TOKENS = 8


class ReleasedCheckpointError(RuntimeError):
    """A released CDE checkpoint could not be read: names the file, config field or download that failed."""


# ----------------------------------------------------------------------------------------------------------------
# Recognising and fetching


def resolve_name(name_or_path: str) -> str:
    """``cde-small`` / ``cde-small-v1`` / ``cde-small-v2`` -> their hub ids; anything else unchanged."""
    return ALIASES.get(str(name_or_path), str(name_or_path))


def is_released_config(config: dict) -> bool:
    """Whether a ``config.json`` dict is a released CDE model's (the research code's config fields)."""
    return "transductive_corpus_size" in config and "embedder" in config


def is_released_checkpoint(name_or_path: str, **hub: Any) -> bool:
    """Whether ``name_or_path`` names a released CDE model: a short name, a local folder in the released layout,
    or a hub repo whose ``config.json`` (cached or downloadable) has the CDE fields. Never raises."""
    name = resolve_name(name_or_path)
    if name in ALIASES.values():
        return True
    path = Path(name).expanduser()
    if path.is_dir():
        config = path / CONFIG_FILE
        if (path / "modules.json").is_file() and (path / "cde_config.json").is_file():
            return False
        if not config.is_file():
            return _has_released_weights(path)  # the loader then says which file is missing
        try:
            return is_released_config(json.loads(config.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return _has_released_weights(path)  # the loader then says the config cannot be read
    if path.exists() or name.count("/") != 1 or name.startswith((".", "/", "~")):
        return False
    try:
        return is_released_config(_read_json(_fetch(name, CONFIG_FILE, **hub)))
    except ReleasedCheckpointError:
        return False


def offline_hub_problem(name: str, cache_folder: str | None = None, local_files_only: bool = False) -> str | None:
    """Why ``name`` cannot be loaded when it is a hub id (not a local path) that the Hugging Face cache does not
    hold while the hub cannot be reached (``HF_HUB_OFFLINE=1`` or ``local_files_only``); None otherwise. Offline, an
    unknown id cannot be told apart from an uncached one, so the message says both and what to do."""
    from huggingface_hub import constants, try_to_load_from_cache

    offline = (
        local_files_only
        or constants.HF_HUB_OFFLINE
        or os.environ.get("HF_HUB_OFFLINE", "0").lower()
        in (
            "1",
            "true",
            "yes",
        )
    )
    name = resolve_name(name)
    if not offline or Path(name).expanduser().exists() or name.count("/") != 1 or name.startswith((".", "/", "~")):
        return None
    for filename in ("modules.json", CONFIG_FILE):
        try:
            if isinstance(try_to_load_from_cache(name, filename, cache_dir=cache_folder), str):
                return None
        except Exception:  # not a valid repo id
            return None
    return (
        f"{name!r} is not a local folder and not in the Hugging Face cache, and the hub cannot be reached (offline: "
        "HF_HUB_OFFLINE=1 or local_files_only): it may be a hub id not downloaded yet, or no model at all. Check "
        "the name, download it once online, or give a local folder."
    )


def _has_released_weights(folder: Path) -> bool:
    """Whether ``folder/model.safetensors`` holds the research code's parameter names (a released checkpoint's
    weights), read from the file's header only."""
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        return False
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            names = list(f.keys())
    except Exception:  # not safetensors: not ours to judge here
        return False
    return any(n.startswith("first_stage_model.") for n in names) and any(
        n.startswith("second_stage_model.") for n in names
    )


def _fetch(
    repo_or_folder: str,
    filename: str,
    revision: str | None = None,
    cache_folder: str | None = None,
    token: bool | str | None = None,
    local_files_only: bool = False,
) -> str:
    """Path of ``filename`` in a local folder, or in the Hugging Face cache (downloading it when online)."""
    folder = Path(repo_or_folder).expanduser()
    if folder.is_dir():
        path = folder / filename
        if not path.is_file():
            raise ReleasedCheckpointError(f"{path} is missing: a released CDE folder needs {filename}.")
        return str(path)
    try:
        return hf_hub_download(
            repo_or_folder,
            filename,
            revision=revision,
            cache_dir=cache_folder,
            token=token,
            local_files_only=local_files_only,
        )
    except Exception as err:  # offline, missing repo or file: hub errors come in many types
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or local_files_only
        hint = (
            " The hub is not reachable (offline) and the file is not in the Hugging Face cache: download it once "
            "online, or give a local folder holding the released repo's files."
            if offline
            else ""
        )
        raise ReleasedCheckpointError(f"Could not get {filename!r} of {repo_or_folder!r}: {err}.{hint}") from err


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ReleasedCheckpointError(f"{path} is not a readable JSON file: {err}") from err


# ----------------------------------------------------------------------------------------------------------------
# Configs


def backbone_config(raw: dict):
    """A transformers config for a released backbone from its ``config.json`` dict (``modernbert`` or
    ``nomic_bert``, including nomic's own GPT-2-style field names: ``n_embd``, ``n_layer``, ``n_inner``, ...)."""
    raw = {k: v for k, v in raw.items() if not k.startswith("_")}
    model_type = raw.get("model_type")
    if model_type == "modernbert":
        return ModernBertConfig.from_dict(raw)
    if model_type == "nomic_bert":
        if "n_embd" not in raw:
            return NomicBertConfig.from_dict(raw)
        return _nomic_config(raw)
    raise ReleasedCheckpointError(
        f"Backbone model_type {model_type!r} is not one of the released CDE backbones (modernbert, nomic_bert)."
    )


def _nomic_config(raw: dict) -> NomicBertConfig:
    """nomic-bert-2048's config (contrastors field names) -> ``transformers.NomicBertConfig``."""
    unsupported = {
        "rotary_emb_fraction": (raw.get("rotary_emb_fraction", 1.0), 1.0),
        "rotary_emb_interleaved": (raw.get("rotary_emb_interleaved", False), False),
        "prenorm": (raw.get("prenorm", False), False),
        "qkv_proj_bias": (raw.get("qkv_proj_bias", False), False),
        "mlp_fc1_bias": (raw.get("mlp_fc1_bias", False), False),
        "mlp_fc2_bias": (raw.get("mlp_fc2_bias", False), False),
        "activation_function": (raw.get("activation_function", "swiglu"), "swiglu"),
        "use_rms_norm": (raw.get("use_rms_norm", False), False),
        "parallel_block": (raw.get("parallel_block", False), False),
    }
    bad = {k: v for k, (v, want) in unsupported.items() if v != want and v is not None}
    if bad:
        raise ReleasedCheckpointError(f"NomicBERT settings not supported by transformers' NomicBertModel: {bad}.")
    multiple = raw.get("pad_vocab_size_multiple", 1) or 1

    def round_up(n: int, m: int) -> int:
        return (n + m - 1) // m * m

    return NomicBertConfig(
        vocab_size=round_up(raw["vocab_size"], multiple),
        hidden_size=raw["n_embd"],
        num_hidden_layers=raw["n_layer"],
        num_attention_heads=raw["n_head"],
        # nomic's gated MLP rounds its hidden features up to a multiple of 256
        intermediate_size=round_up(raw.get("n_inner") or 4 * raw["n_embd"], 256),
        hidden_act="silu",
        max_position_embeddings=raw.get("n_positions", 2048),
        type_vocab_size=raw.get("type_vocab_size", 2),
        layer_norm_eps=raw.get("layer_norm_epsilon", 1e-12),
        pad_token_id=raw.get("pad_token_id") or 0,
        rope_parameters={"rope_type": "default", "rope_theta": float(raw.get("rotary_emb_base", 10000))},
    )


# The released config.json fields cde_st reads: field -> (type, default when absent).
_CDE_FIELDS: dict[str, tuple[Any, Any]] = {
    "transductive_corpus_size": (int, None),
    "max_seq_length": (int, 512),
    "transductive_sequence_dropout_prob": (float, 0.0),
    "transductive_tokens_per_document": (int, 1),
    "autoregressive_backbone": (bool, False),
    "pooling_strategy": (str, "mean"),
    "embedding_output_dim": (int | None, None),
    "limit_layers": (int | None, None),
    "limit_layers_first_stage": (int | None, None),
    "transductive_tie_token_embeddings": (bool, False),
    "dataset_backbone": (str | None, None),
    "pool_ignore_contextual_tokens": (bool, True),
    "pool_ignore_instruction_tokens": (bool, False),
    "disable_transductive_rotary_embedding": (bool, False),
}


def _cde_fields(cde: dict, source: str) -> dict[str, Any]:
    """The released ``config.json`` fields by cde_st's one coercion rule (:mod:`cde_st.coercion`): a boolean must be
    true/false (``"false"`` would read as True), a count a whole number (8.7 is not 8), and a context size >= 1
    (0 would load the model as a bi-encoder). A :class:`ReleasedCheckpointError` names ``source`` and the field."""
    values = {}
    for field, (hint, default) in _CDE_FIELDS.items():
        if field not in cde and default is None and field == "transductive_corpus_size":
            raise ReleasedCheckpointError(f"{source}: field 'transductive_corpus_size' (the context size) is missing.")
        try:
            values[field] = coerce(cde.get(field, default), hint, field)
        except ConfigValueError as err:
            raise ReleasedCheckpointError(f"{source}: {err}.") from None
    rules = {
        "transductive_corpus_size": (values["transductive_corpus_size"] >= 1, "must be >= 1 (the context slots)"),
        "max_seq_length": (values["max_seq_length"] >= 1, "must be >= 1 (a token limit)"),
        "transductive_sequence_dropout_prob": (
            0.0 <= values["transductive_sequence_dropout_prob"] < 1.0,
            "must be in [0, 1)",
        ),
    }
    for field, (ok, rule) in rules.items():
        if not ok:
            raise ReleasedCheckpointError(f"{source}: field {field!r} = {values[field]!r}: {rule}.")
    return values


def module_config(cde: dict, model_type: str, source: str = CONFIG_FILE) -> ContextualConfig:
    """The :class:`ContextualConfig` reproducing a released model, from its ``config.json`` and backbone type.

    Raises :class:`ReleasedCheckpointError` naming ``source`` and the field for a value that would be misread
    (:func:`_cde_fields`) and for research-code options the releases do not use (and cde_st does not implement)."""
    # The residual head and the instruction rule arrived together with the pool_ignore_* fields (cde-small-v2).
    v2_code = "pool_ignore_instruction_tokens" in cde
    cde = {**cde, **_cde_fields(cde, source)}

    def require(field: str, ok: bool) -> None:
        if not ok:
            raise ReleasedCheckpointError(f"{source}: field {field}={cde.get(field)!r} is not supported.")

    require("transductive_tokens_per_document", cde.get("transductive_tokens_per_document", 1) == 1)
    require("autoregressive_backbone", not cde.get("autoregressive_backbone", False))
    require("pooling_strategy", cde.get("pooling_strategy", "mean") == "mean")
    require("embedding_output_dim", cde.get("embedding_output_dim") is None)
    require("limit_layers", cde.get("limit_layers") is None)
    require("limit_layers_first_stage", cde.get("limit_layers_first_stage") is None)
    require("transductive_tie_token_embeddings", not cde.get("transductive_tie_token_embeddings", False))
    require("dataset_backbone", cde.get("dataset_backbone") is None)
    require("pool_ignore_contextual_tokens", cde.get("pool_ignore_contextual_tokens", True))
    if model_type == "nomic_bert":
        # rotary excluded from the context rows (the research code's _shift_rotary_embedding, nomic models only)
        positions = "sequence_except_context" if cde.get("disable_transductive_rotary_embedding") else "sequence"
    else:
        positions = "sequence"
    return ContextualConfig(
        context_size=cde["transductive_corpus_size"],
        max_seq_length=cde["max_seq_length"],
        sequence_dropout=cde["transductive_sequence_dropout_prob"],
        include_prompt=True,
        first_stage_head="mlp",
        first_stage_residual=False,
        first_stage_norm=False,
        output_head="residual_mlp" if v2_code else "mlp",
        attn_implementation="sdpa",
        soft_prompt_tokens=_SOFT_PROMPT_TOKENS,
        prefix_positions=positions,
        embed_joint_sequence=True,
        local_attention_scope="sequence",
        pool_skip_instruction=": " if cde.get("pool_ignore_instruction_tokens") else None,
        context_padding="tile",
    )


# ----------------------------------------------------------------------------------------------------------------
# Weights


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


# ----------------------------------------------------------------------------------------------------------------
# Loading


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
    cde = _read_json(_fetch(name, CONFIG_FILE, **hub))
    if not is_released_config(cde):
        raise ReleasedCheckpointError(
            f"{name}/{CONFIG_FILE} has no transductive_corpus_size/embedder fields: not a released CDE model."
        )
    dtype = resolve_dtype(dtype, cde)  # "auto": the dtype config.json records
    folder = Path(name).expanduser() if Path(name).expanduser().is_dir() else None
    backbone_hub = dict(cache_folder=cache_folder, token=token, local_files_only=local_files_only)
    raw, config_source = _released_backbone_config(name, cde["embedder"], folder, backbone_config, backbone_hub)
    check_backbone_config(raw, cde["embedder"], config_source)
    config = _backbone_from_raw(raw, config_source)
    tokenizer, token_source = _released_tokenizer(name, cde["embedder"], folder, tokenizer, backbone_hub)

    settings = module_config(cde, config.model_type, source=_source_name(name, CONFIG_FILE))
    if attn_implementation is not None:
        settings = dataclasses.replace(settings, attn_implementation=attn_implementation)
    weights_path = _fetch(name, WEIGHTS_FILE, **hub)
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
        return _read_json(config_source), config_source
    if folder is not None and (folder / BACKBONE_CONFIG_FILE).is_file():
        config_source = str(folder / BACKBONE_CONFIG_FILE)
        return _read_json(config_source), config_source
    try:
        config_source = _fetch(embedder, CONFIG_FILE, **backbone_hub)
        return _read_json(config_source), config_source
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
        if folder is not None and any((folder / f).is_file() for f in _TOKENIZER_FILES):
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


def _backbone_from_raw(raw: dict, source: str = "the backbone config"):
    try:
        return backbone_config(raw)
    except ReleasedCheckpointError as err:
        raise ReleasedCheckpointError(f"{source}: {err}") from None
    except Exception as err:
        raise ReleasedCheckpointError(f"{source} could not be read as a backbone config: {err}") from err


def _source_name(name: str, filename: str) -> str:
    folder = Path(name).expanduser()
    return str(folder / filename) if folder.is_dir() else f"{filename} of {name!r}"


# Backbone fields by type and rule (ModernBERT and NomicBERT field names): checked before transformers reads them,
# whose own errors do not name the file, and which takes some nonsense (a negative window) without a word.
def _positive(v: Any) -> bool:
    return v is not None and v > 0 and (not isinstance(v, float) or math.isfinite(v))


_BACKBONE_FIELDS: dict[str, tuple[Any, Any, str]] = {
    # name: (type, accepts(value), rule)
    "vocab_size": (int, _positive, "must be >= 1"),
    "hidden_size": (int, _positive, "must be >= 1"),
    "intermediate_size": (int, _positive, "must be >= 1"),
    "num_hidden_layers": (int, _positive, "must be >= 1"),
    "num_attention_heads": (int, _positive, "must be >= 1"),
    "max_position_embeddings": (int, _positive, "must be >= 1"),
    "local_attention": (int, _positive, "must be >= 1 (the sliding window, in tokens)"),
    "global_attn_every_n_layers": (int, _positive, "must be >= 1"),
    "norm_eps": (float, _positive, "must be a finite number > 0"),
    "global_rope_theta": (float, _positive, "must be a finite number > 0"),
    "local_rope_theta": (float, _positive, "must be a finite number > 0"),
    "n_embd": (int, _positive, "must be >= 1"),
    "n_head": (int, _positive, "must be >= 1"),
    "n_layer": (int, _positive, "must be >= 1"),
    "n_inner": (int | None, lambda v: v is None or v > 0, "must be >= 1 or null"),
    "n_positions": (int, _positive, "must be >= 1"),
    "pad_vocab_size_multiple": (int | None, lambda v: v is None or v > 0, "must be >= 1 or null"),
    "type_vocab_size": (int, _positive, "must be >= 1"),
    "layer_norm_epsilon": (float, _positive, "must be a finite number > 0"),
    "layer_norm_eps": (float, _positive, "must be a finite number > 0"),
    "rotary_emb_base": (float, _positive, "must be a finite number > 0"),
}

# The architecture the released weights were trained with: their embedder's public config, the fields that do not
# change a tensor's shape (a config that differs there would load and compute another model). Checked when the
# backbone config has the released sizes (a smaller copy is another backbone, e.g. a test fixture).
_RELEASED_BACKBONES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "answerdotai/ModernBERT-base": (
        {"hidden_size": 768, "num_hidden_layers": 22, "intermediate_size": 1152},
        {
            "num_attention_heads": 12,
            "local_attention": 128,
            "global_attn_every_n_layers": 3,
            "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0,
            "norm_eps": 1e-05,
            "hidden_activation": "gelu",
        },
    ),
    "nomic-ai/nomic-bert-2048": (
        {"n_embd": 768, "n_layer": 12, "n_inner": 3072},
        {"n_head": 12, "rotary_emb_base": 1000.0, "layer_norm_epsilon": 1e-12, "activation_function": "swiglu"},
    ),
}


def check_backbone_config(raw: dict, embedder: str, source: str) -> None:
    """A :class:`ReleasedCheckpointError` naming ``source`` and the field when the backbone config ``raw`` holds a
    value of the wrong type or range (by :mod:`cde_st.coercion`'s rule), a head count that does not divide the
    width, or, for a backbone with the sizes of the released ``embedder``, an architecture field (heads, window,
    rope theta, norm eps, ...) other than the embedder's: the weights would load and compute another model."""
    checked = {}
    for field, (hint, accepts, rule) in _BACKBONE_FIELDS.items():
        if field not in raw:
            continue
        try:
            value = coerce(raw[field], hint, field)
        except ConfigValueError as err:
            raise ReleasedCheckpointError(f"{source}: {err}.") from None
        if not accepts(value):
            raise ReleasedCheckpointError(f"{source}: field {field!r} = {raw[field]!r}: {rule}.")
        checked[field] = value
    for heads, width in (("num_attention_heads", "hidden_size"), ("n_head", "n_embd")):
        if heads in checked and width in checked and checked[width] % checked[heads]:
            raise ReleasedCheckpointError(
                f"{source}: field {heads!r} = {checked[heads]} does not divide {width} {checked[width]} (each head "
                "takes an equal share of the width)."
            )
    if embedder not in _RELEASED_BACKBONES:
        return
    sizes, architecture = _RELEASED_BACKBONES[embedder]
    if any(checked.get(k, raw.get(k)) != v for k, v in sizes.items()):
        return
    for field, expected in architecture.items():
        value = checked.get(field, raw.get(field, expected))
        if value != expected:
            raise ReleasedCheckpointError(
                f"{source}: field {field!r} = {raw.get(field)!r}, but the released weights were trained with "
                f"{embedder}'s {field} = {expected!r}; with the tensor shapes unchanged they would load and compute "
                f"another model. Use {embedder}'s own config (leave backbone_config out when online)."
            )


def _tokenizer_hub(hub: dict) -> dict:
    # trust_remote_code=False: a released folder's config.json names remote code (auto_map), which must never run
    # (and must not make transformers prompt on stdin) just to read a tokenizer.
    return {
        "cache_dir": hub["cache_folder"],
        "token": hub["token"],
        "local_files_only": hub["local_files_only"],
        "trust_remote_code": False,
    }
