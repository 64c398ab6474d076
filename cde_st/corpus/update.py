"""A new version of an embedded corpus: brought up to date with its corpus (``cde-st-embed MODEL CORPUS --out DIR
--update``, :func:`update_corpus`), or embedded again with a new context (``--recontextualize``,
:func:`recontextualize_corpus`).

An update compares CORPUS with the folder by id and content hash (:func:`~cde_st.corpus.shards.content_hash` of the
text the model reads, with the folder's recorded reader fields), embeds the added and changed documents with the
folder's recorded context (never a new sample), and leaves the deleted ones out. The new version is the one a full
run over CORPUS with that context writes: shard ``k`` holds the valid records of positions ``[k * S, (k + 1) * S)``
of CORPUS, in corpus order; the rows of unchanged documents are copied from the live version, and a shard whose rows
are exactly those of live shard ``k`` is kept as it is. The embeddings equal a full run's to float rounding (at most
1e-6; a document embedded beside other documents in a padded batch differs in the last bits).

The index: exact (flat) search is rebuilt from the new rows (reading them costs what adding them does); an IVF index
keeps its trained quantiser while the corpus has not drifted far (:func:`~cde_st.corpus.index.keeps_quantiser`:
training is the costly part, and centroids fit to the documents the context was made from still fit them), else it
is trained again; a new context always trains a new one.

Crash safety: the new version is written beside the live one (``.v{g}`` files, :mod:`~cde_st.corpus.versions`), its
progress in ``update-pending.json``; the manifest, rewritten last and atomically, switches readers to it, and the files
only the old version used are removed after. Killed at any point, the folder reads as the old version until the
switch and as the new one after it, and the same command finishes the update. Bad input (a repeated id, another
model, a folder no run finished) is refused before anything is written.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cde_st.corpus.corpus_context import CONTEXT_FILE, context_path, read_context_file
from cde_st.corpus.drift import DriftReference, attach_reference, manifest_drift
from cde_st.corpus.index import write_index
from cde_st.corpus.job import (
    check_not_empty,
    finished_shards,
    job_header,
    make_encoder,
    record_shard,
    sample_for,
    sample_request,
    sampled_context,
    shard_records,
)
from cde_st.corpus.manifest import ForeignOutputError, add_history, check_same_embedding, read_manifest, write_manifest
from cde_st.corpus.output_folder import OutputFolder
from cde_st.corpus.previous_version import PreviousVersion
from cde_st.corpus.readers import CorpusBatch, CorpusReader
from cde_st.corpus.scan import scan_corpus
from cde_st.corpus.shards import content_hash
from cde_st.corpus.versions import (
    PENDING_FILE,
    live_files,
    read_pending,
    remove_superseded,
    versioned_name,
    write_pending,
)

__all__ = ["recontextualize_corpus", "update_corpus"]


def update_corpus(model: Any, corpus_path: str | Path, out_dir: str | Path, **options: Any) -> dict[str, Any]:
    """Bring the embedded corpus in ``out_dir`` up to date with ``corpus_path`` (see the module docstring); return
    the new manifest, whose last ``history`` entry counts the added, changed, deleted and unchanged documents.

    Options (all optional): ``model_name``; ``batch_size`` (32); ``devices`` / ``ray_workers`` as for
    :func:`~cde_st.corpus.embed_corpus`; ``reader_options`` and ``settings`` (``dtype``, ``shard_size``,
    ``normalized``, ``skip_invalid``): the folder's recorded values are used, and a value given that differs is
    refused; ``index``: the kind of index (default: the folder's, ``"none"`` for none); ``show_progress_bar``.

    Raises:
        FileNotFoundError: ``out_dir`` holds no finished cde-st-embed folder.
        cde_st.corpus.manifest.ForeignOutputError: another model (both fingerprints named), prompt or setting.
        cde_st.data.DataError: a bad record of the corpus (file and line named), e.g. a repeated id.
    """
    return _new_version(model, corpus_path, out_dir, None, options)


def recontextualize_corpus(
    model: Any,
    corpus_path: str | Path,
    out_dir: str | Path,
    context_size: int | None = None,
    seed: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Sample a new context from ``corpus_path`` (``context_size`` and ``seed`` default to the folder's) and embed
    every document again with it, as a new version of ``out_dir`` that readers switch to at once; a new drift
    reference is made with it. Options as :func:`update_corpus`."""
    live = _finished_manifest(Path(out_dir))
    recorded = (live.get("context") or {}).get("request") or {}
    if live.get("context") is None:
        raise ValueError(f"{out_dir} was embedded by a plain model (no context): there is no context to re-sample.")
    size = context_size if context_size is not None else recorded.get("size", live["context"]["size"])
    if size < 1:
        raise ValueError(f"context_size (--context-size) must be at least 1 document, got {size}.")
    request = sample_request(model, size, seed if seed is not None else recorded.get("seed", 0))
    return _new_version(model, corpus_path, out_dir, request, options)


def _finished_manifest(out: Path) -> dict[str, Any]:
    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None:
        raise FileNotFoundError(
            f"{out}: no cde-st-embed folder to update (no manifest.json); run cde-st-embed without --update first."
        )
    if not manifest.get("complete"):
        raise ValueError(
            f"{out}: its first run has not finished; rerun that command (without --update) to finish it first."
        )
    return manifest


def _reader(corpus_path, out: Path, live: dict, given: dict | None) -> CorpusReader:
    """The corpus read with the folder's reader fields; a field given with another value is refused."""
    recorded, given = live.get("reader"), dict(given or {})
    if recorded is None:  # a folder written before the reader fields were recorded: read as given
        return CorpusReader(corpus_path, skip_invalid=live["skip_invalid"], **given)
    for key, value in given.items():
        if recorded.get(key) != value:
            raise ForeignOutputError(
                f"{out} was embedded with {key.replace('_', '-')} {recorded.get(key)!r}; this run gives {value!r}. "
                "An update reads the corpus as the folder was made: leave it out, or use another --out folder."
            )
    return CorpusReader(corpus_path, skip_invalid=live["skip_invalid"], **recorded)


def _check_settings(out: Path, live: dict, settings: dict | None) -> None:
    for key, value in (settings or {}).items():
        if value is not None and value != live[key]:
            raise ForeignOutputError(
                f"{out} stores {key} {live[key]!r}; this run asks for {value!r}. An update keeps the folder's "
                "settings: leave it out, or use another --out folder."
            )


class _Plan:
    """What the update does, counted while the corpus is scanned: documents added, changed, unchanged (and so
    deleted) against the live version."""

    def __init__(self, previous: PreviousVersion, embed_all: bool) -> None:
        self.previous, self.embed_all = previous, embed_all
        self.added = self.changed = self.unchanged = 0

    def observe(self, batch: CorpusBatch, repeated: set[int]) -> None:
        kept = [i for i in range(len(batch)) if i not in repeated]
        found = self.previous.lookup([batch.ids[i] for i in kept])
        for i, row in zip(kept, found):
            if row is None:
                self.added += 1
            elif row[0] is None or row[0] != content_hash(batch.texts[i]):
                self.changed += 1
            else:
                self.unchanged += 1

    @property
    def to_embed(self) -> int:
        return self.added + self.changed + (self.unchanged if self.embed_all else 0)

    def counts(self) -> dict[str, int]:
        deleted = self.previous.rows - self.changed - self.unchanged
        return {"added": self.added, "changed": self.changed, "deleted": deleted, "unchanged": self.unchanged}


def _new_version(model, corpus_path, out_dir, request: dict | None, options: dict) -> dict:
    out = Path(out_dir)
    _finished_manifest(out)  # before the lock: a missing folder is not created
    kind = "update" if request is None else "recontextualize"
    with OutputFolder(out) as folder:
        model.eval()
        live = _finished_manifest(out)
        reader = _reader(corpus_path, out, live, options.get("reader_options"))
        model_name = options.get("model_name") or live["model"]["name"]
        header = job_header(model, model_name, reader, live["dtype"], live["shard_size"], live["normalized"])
        check_same_embedding(out, live, header)
        _check_settings(out, live, options.get("settings"))
        generation = live.get("generation", 0) + 1
        mark = {"base_generation": live.get("generation", 0), "kind": kind, "request": request}
        with PreviousVersion(out, live) as previous:
            plan = _Plan(previous, embed_all=request is not None)
            show = options.get("show_progress_bar", True)
            scan = scan_corpus(reader, out, sample_for(request), show, on_batch=plan.observe)
            check_not_empty(reader, scan)
            # Nothing was written in the folder up to here: bad input leaves it as it was.
            manifest = {**header, "scan": scan.to_dict(), "generation": generation, "history": live.get("history", [])}
            context, reference = _context_and_reference(model, out, live, manifest, request, scan, options)
            pending = read_pending(out)
            resumable = _resumes(pending, manifest, mark)
            remove_superseded(out, live_files(live) | live_files(manifest) | live_files(resumable))
            folder.remove_leftovers()
            done = finished_shards(out, resumable) if resumable else {}
            manifest.update(shards=sorted(done.values(), key=lambda e: e["index"]), complete=False)
            write_pending(out, {**manifest, "pending": mark})
            _write_version(model, reader, out, manifest, previous, context, reference, plan, mark, options)
            if request is not None:
                attach_reference(out, manifest, request["seed"])
        _switch(out, live, manifest, plan.counts(), kind, options.get("index"), show)
        return manifest


def _context_and_reference(model, out: Path, live: dict, manifest: dict, request, scan, options):
    """The version's context vectors and drift reference: the live ones for an update; for a new context, sampled
    and embedded now (deterministic, so a resumed run makes the same), written under the version's names."""
    if request is None:
        manifest["context"] = live.get("context")
        if live.get("context"):
            manifest["context_file"] = context_path(out, live).name
        manifest["drift"] = live.get("drift")
        context = read_context_file(context_path(out, manifest)).vectors if manifest["context"] else None
        drift = manifest["drift"]
        reference = DriftReference.load(out / drift["reference_file"]) if drift else None
        return context, reference
    batch_size = options.get("batch_size", 32)
    made = sampled_context(model, scan, request, batch_size)
    generation = manifest["generation"]
    manifest.update(context=made.describe(), context_file=versioned_name(CONTEXT_FILE, generation))
    made.save(out / manifest["context_file"])
    manifest["drift"] = None  # made from the new version's stored embeddings once they are all written
    return made.vectors, None


def _resumes(pending: dict | None, manifest: dict, mark: dict) -> dict | None:
    """The pending record when it is this very version half written (same base, corpus, kind and context)."""
    if pending is None or pending.get("pending") != mark or pending.get("generation") != manifest["generation"]:
        return None
    same_corpus = (pending.get("corpus") or {}).get("sha256") == manifest["corpus"]["sha256"]
    same_context = (pending.get("context") or {}).get("fingerprint") == (manifest["context"] or {}).get("fingerprint")
    return pending if same_corpus and same_context else None


def _write_version(model, reader, out: Path, manifest, previous, context, reference, plan, mark, options) -> None:
    """Write every shard of the new version that is not written yet, recording each in the pending record."""
    shard_size, scan = manifest["shard_size"], manifest["scan"]
    n_shards = -(-scan["records"] // shard_size)
    todo = [k for k in range(n_shards) if k not in {e["index"] for e in manifest["shards"]}]
    show = options.get("show_progress_bar", True)
    bar = tqdm(total=plan.to_embed, desc="Embedding", unit=" docs", disable=not show, smoothing=0.1)
    workers = (
        {"ray_workers": options["ray_workers"]} if options.get("ray_workers") else {"devices": options.get("devices")}
    )
    with contextlib.ExitStack() as stack:
        encoders = []  # started on the first document to embed: a no-op update starts no pool

        def encode(texts: list[str]) -> np.ndarray:
            if not encoders:
                batch_size = options.get("batch_size", 32)
                encoders.append(
                    stack.enter_context(make_encoder(model, context, workers, batch_size, manifest["normalized"]))
                )
            return encoders[0].encode_shards([texts])[0]

        records = shard_records(reader, todo, shard_size, set(scan["duplicate_positions"])) if todo else []
        for k, ids, texts in records:
            entry, embedded = _new_shard(out, manifest, previous, encode, k, ids, texts, reference, plan.embed_all)
            manifest["shards"] = sorted([*manifest["shards"], entry], key=lambda e: e["index"])
            write_pending(out, {**manifest, "pending": mark})
            bar.update(embedded)
    bar.close()


def _new_shard(out, manifest, previous, encode, k, ids, texts, reference, embed_all) -> tuple[dict, int]:
    """Shard ``k`` of the new version: the live shard kept when its rows are the same, else written from copied
    rows (unchanged documents) and embedded ones; returns its entry and how many documents were embedded."""
    hashes = [content_hash(t) for t in texts]
    found = [None] * len(ids) if embed_all else previous.lookup(ids)
    same = [row is not None and row[0] == digest for row, digest in zip(found, hashes)]
    if ids and all(same):
        kept = previous.whole_shard(k, found)
        if kept is not None:
            return kept, 0
    embeddings = np.zeros((len(ids), manifest["dimension"]), dtype=np.float32)
    fresh = [i for i, s in enumerate(same) if not s]
    if fresh:
        embeddings[fresh] = encode([texts[i] for i in fresh])
    by_shard: dict[int, list[int]] = {}
    for i, row in enumerate(found):
        if same[i]:
            by_shard.setdefault(row[1], []).append(i)
    for index, positions in by_shard.items():
        embeddings[positions] = previous.embeddings(index, [found[i][2] for i in positions])
    return record_shard(out, manifest, k, (ids, hashes, embeddings), reference), len(fresh)


def _switch(out: Path, live: dict, manifest: dict, counts: dict, kind: str, index: str | None, show: bool) -> None:
    """Index the new version, then switch readers to it (the manifest, atomically) and remove what only the old
    version used."""
    manifest["counts"] = {"embedded": sum(e["rows"] for e in manifest["shards"]), "shards": len(manifest["shards"])}
    old_index = live.get("index")
    wanted = index or (old_index or {}).get("requested", "auto")
    same_rows = [e["file"] for e in manifest["shards"]] == [e["file"] for e in live["shards"]]
    if wanted != "none":
        if same_rows and old_index and wanted == old_index.get("requested", "auto"):
            manifest["index"] = old_index  # the same rows in the same files: the live index is this version's
        else:
            previous = old_index if kind == "update" and old_index else None
            manifest["index"] = write_index(out, manifest, wanted, 0, show, previous=previous)
    measured = manifest_drift(manifest)
    add_history(manifest, kind, counts, None if measured is None else measured.percent)
    manifest["complete"] = True
    write_manifest(out, manifest)  # the switch
    (out / PENDING_FILE).unlink(missing_ok=True)
    remove_superseded(out, live_files(manifest))
