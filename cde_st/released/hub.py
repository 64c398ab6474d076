"""Recognising a released CDE checkpoint (a short name, a local folder in the released layout, a hub repo whose
``config.json`` has the CDE fields) and fetching its files from a local folder or the Hugging Face cache."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download

from cde_st.prompts import DEFAULT_PROMPTS

__all__ = [
    "ALIASES",
    "BACKBONE_CONFIG_FILE",
    "CONFIG_FILE",
    "PROMPTS",
    "TOKENIZER_FILES",
    "WEIGHTS_FILE",
    "ReleasedCheckpointError",
    "fetch",
    "is_released_checkpoint",
    "is_released_config",
    "offline_hub_problem",
    "read_json",
    "resolve_name",
]

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
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


class ReleasedCheckpointError(RuntimeError):
    """A released CDE checkpoint could not be read: names the file, config field or download that failed."""


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
        return is_released_config(read_json(fetch(name, CONFIG_FILE, **hub)))
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


def fetch(
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


def read_json(path: str) -> dict:
    """The JSON object in ``path``, or a :class:`ReleasedCheckpointError` that names the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ReleasedCheckpointError(f"{path} is not a readable JSON file: {err}") from err
