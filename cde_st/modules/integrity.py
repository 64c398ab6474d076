"""Checks that a model folder loads whole, shared by the native and the released loading routes.

A folder can be incomplete or mixed without any file being unreadable: ``tokenizer.json`` missing (transformers then
builds a tokenizer from ``tokenizer_config.json`` alone, five special tokens, every word ``[UNK]``), a weights file
from another save, a config edited by hand, a training run that diverged into NaN. Loading such a folder gives
wrong embeddings with no error. The checks here turn each case into an error that names the folder, the file and
the field:

- the tokenizer against the embedding tables (ids beyond the table; far fewer tokens than rows; a size other than
  the one recorded at save time),
- the weights file against the module built from the config (missing, unexpected, mis-shaped tensors; the encoder
  configs recorded in the weights file's metadata at save time, field by field),
- every floating-point weight finite,
- the save as a whole (:func:`write_manifest`, :func:`check_manifest`): a save records the content hash of each
  file it wrote (weights, context, tokenizer) in ``cde_st_save.json``; at load every recorded file must still
  hold what was written, so a file copied in from another save (a checkpoint's weights over ``final/``, another
  save's context) or a tokenizer edited at the same size (lowercasing off, two ids swapped) is named. Folders saved
  before the record existed load as before, unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

#: Metadata keys of ``model.safetensors`` written by :meth:`ContextualTransformer.save`.
META_CONFIG = "cde_st.{stage}_config"
META_TOKENIZER_SIZE = "cde_st.tokenizer_size"
STAGES = ("first_stage", "second_stage")

#: A tokenizer with fewer tokens than this fraction of the embedding rows is not the model's own (padded tables,
#: e.g. NomicBERT's 30528 rows for 30522 tokens or ModernBERT's 50368 for 50280, are far above it).
MIN_VOCAB_FRACTION = 0.5
#: Files a tokenizer may be built from; the first is the one whose absence degrades silently.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt", "spm.model")

# Config fields that do not change what the encoder computes at inference, or that are load-time choices
# (dtype, attention kernel): they may differ between the recorded and the loaded config.
_FREE_FIELDS = {
    "transformers_version",
    "architectures",
    "dtype",
    "torch_dtype",
    "name_or_path",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "use_cache",
    "id2label",
    "label2id",
    "problem_type",
    "finetuning_task",
    "tokenizer_class",
    "task_specific_params",
    "chunk_size_feed_forward",
    "gradient_checkpointing",
    "initializer_range",
}


def _free(field: str) -> bool:
    # dropout only acts in training, and a fine-tuning run may change it on purpose
    return field.startswith("_") or field in _FREE_FIELDS or "dropout" in field


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def computation_config(config) -> dict[str, Any]:
    """The fields of a transformers config that change what the encoder computes (JSON values)."""
    return {k: _jsonable(v) for k, v in config.to_dict().items() if not _free(k)}


def save_metadata(stages: dict[str, Any], tokenizer) -> dict[str, str]:
    """safetensors metadata recording what the weights were saved with: each encoder's computation config and the
    tokenizer's size. ``stages``: stage name -> transformers config."""
    metadata = {META_CONFIG.format(stage=name): json.dumps(computation_config(c)) for name, c in stages.items()}
    if tokenizer is not None:
        metadata[META_TOKENIZER_SIZE] = str(len(tokenizer))
    return metadata


def tokenizer_source(folder: str | None) -> str:
    """Where a tokenizer came from, with the tokenizer files that folder has (or lacks)."""
    if folder is None or not os.path.isdir(folder):
        return repr(folder)
    present = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(folder, f))]
    note = f"files: {', '.join(present) or 'none'}"
    if TOKENIZER_FILES[0] not in present:
        note += f"; {TOKENIZER_FILES[0]} is missing, so transformers built the tokenizer from the other files alone"
    return f"{folder} ({note})"


def check_tokenizer(
    tokenizer, tables: dict[str, int], source: str, weights: str, recorded_size: int | None = None
) -> None:
    """The tokenizer must fit the embedding tables: no id beyond a table, not far fewer tokens than its rows,
    and (when the weights file records it) the size it had when the model was saved.

    ``tables``: stage name -> rows of its token embedding table; ``source``: where the tokenizer was loaded from
    (:func:`tokenizer_source`); ``weights``: the weights file the tables come from."""
    size = len(tokenizer)
    vocab = tokenizer.get_vocab()
    top = max(vocab.values()) if vocab else -1
    for stage, rows in tables.items():
        problem = None
        if top >= rows:
            problem = f"produces token ids up to {top}, beyond the {rows} rows of {stage}'s embedding table"
        elif recorded_size is not None and size != recorded_size:
            problem = f"has {size} tokens, but the model was saved with a {recorded_size}-token tokenizer"
        elif size < MIN_VOCAB_FRACTION * rows:
            problem = f"has only {size} tokens for the {rows} rows of {stage}'s embedding table"
        if problem is not None:
            raise ValueError(
                f"The tokenizer loaded from {source} {problem} (in {weights}): it is not this model's tokenizer, and "
                "most words would encode wrongly. Put the tokenizer files the model was saved with (tokenizer.json, "
                "tokenizer_config.json) back beside the weights, or save the model again."
            )


def check_recorded_configs(module: nn.Module, metadata: dict[str, str], weights: str, config_path: str) -> None:
    """The encoders built from ``config_path`` must compute what the weights were saved with (the configs
    recorded in the weights file's metadata), field by field. Files saved before cde_st recorded them pass."""
    for stage in STAGES:
        recorded = metadata.get(META_CONFIG.format(stage=stage))
        if recorded is None:
            continue
        built = computation_config(getattr(module, stage).config)
        differ = {k: (v, built[k]) for k, v in json.loads(recorded).items() if k in built and built[k] != v}
        if differ:
            fields = ", ".join(f"{k}={new!r} (saved with {old!r})" for k, (old, new) in sorted(differ.items()))
            raise ValueError(
                f"{config_path}: {stage}_config does not match the encoder the weights in {weights} were saved with: "
                f"{fields}. The config was edited or comes from another save; restore the saved values or save the "
                "model again."
            )


_LAYER = re.compile(r"^(\w+?)\.(?:encoder\.)?layers?\.(\d+)\.")


def _layer_counts(names) -> dict[str, int]:
    counts: dict[str, set[str]] = {}
    for name in names:
        match = _LAYER.match(name)
        if match:
            counts.setdefault(match.group(1), set()).add(match.group(2))
    return {stage: len(layers) for stage, layers in counts.items()}


def _tied(model_state: dict[str, torch.Tensor], name: str, present: set[str]) -> bool:
    """Whether ``name`` shares its storage with a tensor the file holds (safetensors stores a tied tensor once)."""
    ptr = model_state[name].untyped_storage().data_ptr()
    return any(model_state[k].untyped_storage().data_ptr() == ptr for k in present if k in model_state)


def check_state_dict(
    module: nn.Module, shapes: dict[str, tuple[int, ...]], weights: str, config_path: str, ignore=()
) -> None:
    """The tensors in a weights file (name -> shape) must be exactly the module's: every name present, none extra,
    every shape equal. The error names the tensors and, for layer counts, the config field."""
    own = module.state_dict()
    present = set(shapes)
    missing = sorted(k for k in set(own) - present - set(ignore) if not _tied(own, k, present))
    unexpected = sorted(present - set(own))
    mismatched = sorted(k for k in present & set(own) if tuple(own[k].shape) != tuple(shapes[k]))
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing tensor(s) {missing[:5]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected tensor(s) {unexpected[:5]}")
    if mismatched:
        shown = ", ".join(
            f"{k}: {tuple(shapes[k])} in the file, {tuple(own[k].shape)} by the config" for k in mismatched[:5]
        )
        parts.append(f"{len(mismatched)} shape mismatch(es) ({shown})")
    hints = []
    in_file, by_config = _layer_counts(present), _layer_counts(own)
    for stage in sorted(set(in_file) | set(by_config)):
        if in_file.get(stage, 0) != by_config.get(stage, 0):
            hints.append(
                f"{stage} has {in_file.get(stage, 0)} layers in the file, {by_config.get(stage, 0)} by the config"
            )
    hint = f" ({'; '.join(hints)}: num_hidden_layers)" if hints else ""
    raise ValueError(
        f"{weights} does not match {config_path}: {'; '.join(parts)}{hint}. The weights and the config come from "
        "different models or saves (or the file is incomplete); check num_hidden_layers, hidden_size, "
        "intermediate_size and vocab_size, or save the model again."
    )


def _finite(tensor: torch.Tensor) -> bool:
    # min and max propagate NaN and show +-inf; one reduction, ~20x faster on CPU than isfinite(t).all()
    low, high = torch.aminmax(tensor.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def check_finite(module: nn.Module, weights: str) -> None:
    """Every floating-point weight finite: a NaN or inf weight makes every embedding NaN (or silently wrong)."""
    bad = [
        name
        for name, tensor in module.state_dict().items()
        if tensor.is_floating_point() and tensor.numel() and not _finite(tensor)
    ]
    if bad:
        raise ValueError(
            f"{weights} holds NaN or infinite values in {len(bad)} tensor(s): {bad[:5]}. The training run that wrote "
            "it diverged or the file is damaged; load an earlier checkpoint."
        )


def check_readable(path: str) -> None:
    """A PermissionError naming ``path`` when this process may not read it. safetensors reports a file it may not
    open as "No such file or directory", which sends the user looking for a file that is there."""
    try:
        with open(path, "rb"):
            pass
    except PermissionError as exc:
        raise PermissionError(
            f"{path} cannot be read: permission denied ({exc.strerror}). Ask its owner to make it readable "
            "(chmod a+r), or load a copy you can read."
        ) from None


def corrupt_file_error(path: str | None, exc: Exception) -> ValueError:
    """The error for a file that exists but cannot be read (an interrupted download or copy)."""
    return ValueError(
        f"{path} is corrupt or truncated and cannot be read ({type(exc).__name__}: {exc}). Copy or save the model "
        "again (an interrupted download or copy leaves a partial file)."
    )


def load_checked_weights(module: nn.Module, weights: str | None, config_path: str, tokenizer_dir: str | None) -> None:
    """Load ``model.safetensors`` (or ``pytorch_model.bin``) into the contextual module built from ``config_path``,
    once the folder is known to be whole: the encoder configs the weights were saved with, every tensor's name and
    shape, the tokenizer against the embedding tables, finite values."""
    if weights is None:
        folder = os.path.dirname(config_path)
        raise FileNotFoundError(
            f"{folder} has no model.safetensors (or pytorch_model.bin) beside {os.path.basename(config_path)}: "
            "the weights are missing. Copy them from where the model was saved."
        )
    check_readable(weights)
    try:
        if weights.endswith(".safetensors"):
            with safe_open(weights, framework="pt") as f:
                metadata = f.metadata() or {}
                state = {key: f.get_tensor(key) for key in f.keys()}
        else:
            metadata, state = {}, torch.load(weights, map_location="cpu", weights_only=True)
    except (SafetensorError, EOFError, pickle.UnpicklingError) as exc:
        raise corrupt_file_error(weights, exc) from None
    check_recorded_configs(module, metadata, weights, config_path)
    check_state_dict(module, {key: tuple(t.shape) for key, t in state.items()}, weights, config_path)
    recorded = metadata.get(META_TOKENIZER_SIZE)
    check_tokenizer(
        module.tokenizer,
        {stage: getattr(module, stage).get_input_embeddings().num_embeddings for stage in STAGES},
        tokenizer_source(tokenizer_dir),
        weights,
        int(recorded) if recorded is not None else None,
    )
    module.load_state_dict(state, strict=False)  # strict in effect: check_state_dict compared every name
    check_finite(module, weights)


#: The record of one save (:func:`write_manifest`), beside ``cde_config.json``.
MANIFEST_FILE = "cde_st_save.json"
_MANIFEST_FORMAT = 1


def file_sha256(path: str) -> str:
    """The sha256 of a file's content (read in 16 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str, names: Iterable[str]) -> None:
    """Record what one save wrote: ``names`` (files in ``folder``) with their content hashes, in
    :data:`MANIFEST_FILE`. Written last, so it describes the folder as this save left it."""
    files = {name: file_sha256(os.path.join(folder, name)) for name in sorted(set(names))}
    record = {"format": _MANIFEST_FORMAT, "written_by": "cde_st", "files": files}
    with open(os.path.join(folder, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")


def _not_of_this_save(path: str, manifest: str, why: str, what: str) -> ValueError:
    name = os.path.basename(path)
    return ValueError(
        f"{path} was not written with the other files of this save: {why}. It comes from another save (e.g. a "
        f"checkpoint's {WEIGHTS_NAMES[0]} copied over final/) or was edited, so {what}. Put back the {name} this "
        "save wrote, or load the save it comes from as a whole and save that model again; to load the folder as it "
        f"is anyway, delete {manifest} (nothing is checked then)."
    )


#: The weights file names of a save, in the order loading looks for them.
WEIGHTS_NAMES = ("model.safetensors", "pytorch_model.bin")


def _consequence(name: str) -> str:
    if name in WEIGHTS_NAMES:
        return "the saved context and tokenizer were made for other weights and the embeddings would be wrong"
    if name.startswith(("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "spm", "sentencepiece")):
        return "texts would be tokenised otherwise than the weights were trained with and the embeddings would be wrong"
    return (
        "it is not the context this save's weights and config go with (another corpus, or vectors made by other "
        "weights) and the embeddings would be wrong"
    )


def check_manifest(resolve: Callable[[str], str | None], used: Iterable[str]) -> None:
    """Check a folder against the record its save left (:func:`write_manifest`): each recorded file present with the
    recorded content, and each file loading used (``used``: names, e.g. the weights and context files) among them.
    ``resolve``: file name -> local path or None (a hub folder downloads it). A folder without the record (saved
    before cde_st wrote one) passes unchecked."""
    manifest = resolve(MANIFEST_FILE)
    if manifest is None:
        return
    try:
        with open(manifest, encoding="utf-8") as f:
            record = json.load(f)
        files = record["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{manifest} cannot be read ({type(exc).__name__}: {exc}): it is the record of what this save wrote. "
            "Save the model again, or delete the file to load the folder unchecked."
        ) from None
    for name, recorded in sorted(files.items()):
        path = resolve(name)
        if path is None:
            raise FileNotFoundError(
                f"{name} is missing from {os.path.dirname(manifest)}, but {manifest} records that the save wrote it. "
                "Copy it back from where the model was saved, or save the model again."
            )
        actual = file_sha256(path)
        if actual != recorded:
            why = f"its content (sha256 {actual[:12]}...) is not what {MANIFEST_FILE} recorded at save ({recorded[:12]}...)"
            raise _not_of_this_save(path, manifest, why, _consequence(name))
    for name in used:
        if name not in files:
            path = resolve(name) or name
            why = f"{MANIFEST_FILE}, written by the save, does not list it (the save wrote {sorted(files)})"
            raise _not_of_this_save(path, manifest, why, _consequence(name))
