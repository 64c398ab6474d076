"""The manifest of an embedded corpus (``DIR/manifest.json``): what the embeddings are, and which shards are done.

It records what every embedding depends on (the model's identity, the context's fingerprint, the prompt, the
dimension, the storage dtype and the reader's fields), how the corpus was cut (its path, size, SHA-256 and the shard
size: shard ``k`` holds the valid records at stream positions ``[k * shard_size, (k + 1) * shard_size)``), the
counts of the corpus scan, and one entry per finished shard (file, positions, rows, SHA-256). It is rewritten
atomically after each shard, so after a crash it lists exactly the shards that are whole; a rerun of the same job
writes the others.

A job whose model, context, prompt, corpus (content included), reader fields or cut differs from the one a folder
was written with is refused (:class:`ForeignOutputError`), naming both values: a folder of shards never mixes two
embedding spaces, nor two versions of a document. A sampled context's request without ``order`` is in hash order
(:func:`check_sample_order`: such a folder is not continued with the same sample in corpus order).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cde_st.corpus.corpus_context import context_path
from cde_st.corpus.shards import DamagedFileError, write_atomically

__all__ = [
    "FORMAT",
    "HISTORY_LENGTH",
    "MANIFEST_FILE",
    "ForeignOutputError",
    "add_history",
    "check_same_embedding",
    "check_same_job",
    "check_sample_order",
    "read_manifest",
    "write_manifest",
]

FORMAT = "cde_st.embedded_corpus"
MANIFEST_FILE = "manifest.json"
#: The history keeps the last this many runs that made a version (first run, updates, new contexts).
HISTORY_LENGTH = 20

#: The header fields that must match for a rerun to continue a folder: (path in the manifest, what it is).
_SAME_JOB_FIELDS = (
    (("model", "identity"), "model fingerprint"),
    (("prompt",), "prompt"),
    (("dimension",), "dimension"),
    (("dtype",), "dtype"),
    (("shard_size",), "shard size"),
    (("corpus", "path"), "corpus"),
    (("corpus", "bytes"), "corpus size in bytes"),
    (("corpus", "sha256"), "corpus content (SHA-256)"),
    (("reader", "id_field"), "id field (--id-field)"),
    (("reader", "text_field"), "text field (--text-field)"),
    (("reader", "title_field"), "title field (--title-field)"),
    (("reader", "split"), "split (--split)"),
    (("skip_invalid",), "skip_invalid"),
)
#: Recorded since a later version: a folder written before has no value to compare.
_ADDED_LATER = {path for path, _ in _SAME_JOB_FIELDS if path[0] == "reader" or path == ("corpus", "sha256")}
_ABSENT = object()


class ForeignOutputError(ValueError):
    """The output folder holds embeddings of another job (another model, context, prompt or corpus)."""


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of ``folder`` (None when it has none)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, or not UTF-8: written atomically, so altered afterwards
        raise DamagedFileError(
            f"{path} is not readable JSON ({err}): the folder's manifest is damaged. Restore it, or delete "
            f"{path.parent} and run cde-st-embed again."
        ) from None
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != FORMAT:
        raise ForeignOutputError(f"{path} is not a cde-st-embed manifest (format {found!r}).")
    return manifest


def write_manifest(folder: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` atomically (temporary file, fsync, rename)."""
    data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    write_atomically(Path(folder) / MANIFEST_FILE, data)


def _get(manifest: dict, path: tuple[str, ...], absent: Any = None) -> Any:
    for key in path:
        manifest = manifest.get(key, absent) if isinstance(manifest, dict) else absent
    return manifest


def _describe(manifest: dict) -> str:
    context = manifest.get("context") or {}
    return (
        f"model {_get(manifest, ('model', 'name'))} (fingerprint {_get(manifest, ('model', 'identity'))}), "
        f"context fingerprint {context.get('fingerprint', 'none')}, prompt {manifest.get('prompt')!r}"
    )


def check_same_job(folder: str | Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`ForeignOutputError` unless ``new`` (this job's header) continues ``old`` (the folder's)."""
    for path, what in _SAME_JOB_FIELDS:
        if path in _ADDED_LATER and _get(old, path, _ABSENT) is _ABSENT:
            continue
        if path == ("corpus", "sha256") and _get(old, path) != _get(new, path):
            raise ForeignOutputError(
                f"The corpus {_get(new, ('corpus', 'path'))} changed since {folder} was written: same size, other "
                f"content (SHA-256 {_get(old, path)} then, {_get(new, path)} now); its shards would mix old and new "
                "texts. Pass --update to bring the folder up to date with it, use another --out folder, or delete "
                "this one to start over."
            )
        if _get(old, path) != _get(new, path):
            raise ForeignOutputError(
                f"{folder} holds embeddings of another job: its {what} is {_get(old, path)!r}, this run's is "
                f"{_get(new, path)!r}. The folder has: {_describe(old)}; this run: {_describe(new)}. {_what_to_do(path)}"
            )
    old_context, new_context = old.get("context") or {}, new.get("context") or {}
    if old_context.get("fingerprint") != new_context.get("fingerprint"):
        raise ForeignOutputError(
            f"{folder} holds embeddings made with context fingerprint {old_context.get('fingerprint', 'none')}; this "
            f"run's context fingerprint is {new_context.get('fingerprint', 'none')} (model fingerprint "
            f"{_get(new, ('model', 'identity'))} in both). Use another --out folder, or the folder's own context."
        )


def check_sample_order(out_dir: str | Path, old: dict, request: dict | None) -> None:
    """Refuse to continue a folder whose context was sampled in hash order (before cde-st-embed kept the corpus
    order) when this run asks for the same sample in corpus order: other context rows, so the folder's shards would
    mix two embedding spaces. Its own context file still finishes it."""
    recorded = (old.get("context") or {}).get("request") or {}
    if request is None or recorded.get("source") != "sample" or "order" in recorded:
        return
    if request.get("order") != "corpus" or {**recorded, "order": "corpus"} != request:
        return  # the same request (resumed as is), or another sample (refused by its fingerprint)
    raise ForeignOutputError(
        f"{out_dir} was embedded with a context of {recorded['size']} documents sampled with seed {recorded['seed']} "
        "in hash order, as cde-st-embed sampled before it kept the corpus order for models whose context rows carry "
        "positions (this one's do). This run samples the same documents in corpus order, as set_context does: other "
        "context rows, other embeddings, and the folder's shards would mix the two. To finish the folder with its own "
        f"context, pass --context {context_path(out_dir, old)}; to get the embeddings set_context gives, use another "
        "--out folder, or delete this one."
    )


def _what_to_do(path: tuple[str, ...]) -> str:
    if path[0] == "corpus":
        return "Pass --update to bring the folder up to date with this corpus, use another --out folder, or delete it."
    return "Use another --out folder, or delete this one to start over."


def check_same_embedding(folder: str | Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`ForeignOutputError` unless ``new`` (a run's header) embeds as ``old`` (the folder's) did: the
    same model, prompt, dimension, storage, cut and reader fields; the corpus may differ (an update)."""
    check_same_job(folder, old, {**new, "corpus": old.get("corpus"), "context": old.get("context")})


def add_history(manifest: dict[str, Any], kind: str, counts: dict[str, int], drift_percent: float | None) -> None:
    """Append a run that made a version (``kind``: embed, update, recontextualize) to the manifest's history: when,
    the added / changed / deleted / unchanged counts, the corpus's SHA-256 and the drift; the last
    :data:`HISTORY_LENGTH` entries are kept."""
    entry = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kind": kind,
        **counts,
        "documents": sum(e["rows"] for e in manifest.get("shards", [])),
        "corpus_sha256": _get(manifest, ("corpus", "sha256")),
        "generation": manifest.get("generation", 0),
        "drift_percent": None if drift_percent is None else round(drift_percent, 3),
    }
    manifest["history"] = [*manifest.get("history", []), entry][-HISTORY_LENGTH:]
