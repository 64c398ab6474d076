"""``embed_corpus``: embed a whole corpus with one context, into resumable parquet shards and a manifest.

The job, in order:

1. The model's fingerprint (:func:`cde_st.fingerprints.model_fingerprint`), prompt and dimension, the corpus's
   SHA-256 and the reader's fields; a folder written by another job, or holding files no job wrote, is refused
   (:mod:`cde_st.corpus.manifest`, :mod:`cde_st.corpus.output_folder`).
2. One streaming pass over the corpus (:func:`~cde_st.corpus.scan.scan_corpus`): every record checked, repeated
   ids found, records counted and, for a contextual model, the context sampled (:class:`~cde_st.context.BottomKSample`:
   the rows :func:`cde_st.context.sample_context` gives in process).
3. The context, computed once as vectors (or given: the model's, a file), kept in ``DIR/context.safetensors``.
4. A second pass: shard ``k`` holds the valid records of positions ``[k * shard_size, (k + 1) * shard_size)``;
   each shard not yet finished is embedded (in process or on a pool of devices), written atomically, checksummed
   and recorded in the manifest. Killed at any point, the same call finishes the job, and the shards are row for row
   those an uninterrupted run writes (the cut depends on positions only, each shard is embedded in one call).

The row order is the corpus order: the valid records in the order they are read, cut into shards by position. A
later version of the folder (:mod:`cde_st.corpus.update`) keeps that order for the corpus it is made from. With the
context, a reference sample of the corpus is embedded for the drift measure (:mod:`cde_st.corpus.drift`), and each
shard counts its rows unlike it.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cde_st.context import BottomKSample, reads_context_order, tile_sample
from cde_st.corpus.corpus_context import (
    CONTEXT_FILE,
    CorpusContext,
    context_path,
    embed_sampled_context,
    given_context,
    read_context_file,
)
from cde_st.corpus.drift import DriftReference, attach_reference
from cde_st.corpus.encoders import DocumentEncoder, WorkerPool, document_prompt
from cde_st.corpus.manifest import (
    FORMAT,
    add_history,
    check_same_job,
    check_sample_order,
    read_manifest,
    write_manifest,
)
from cde_st.corpus.output_folder import OutputFolder
from cde_st.corpus.readers import CorpusReader
from cde_st.corpus.scan import ScanResult, scan_corpus
from cde_st.corpus.shards import DTYPES, content_hash, read_shard, shard_name, write_shard
from cde_st.corpus.versions import versioned_name
from cde_st.data import DataError
from cde_st.fingerprints import model_fingerprint
from cde_st.model import context_prompt, contextual_module, is_contextual
from cde_st.model_loading import load_options

__all__ = [
    "READ_BATCH",
    "check_not_empty",
    "embed_corpus",
    "finished_shards",
    "job_header",
    "make_encoder",
    "record_shard",
    "sample_for",
    "sample_request",
    "sampled_context",
    "sampled_rows",
    "shard_records",
]

logger = logging.getLogger(__name__)

#: Records per batch read from the corpus in the embedding pass (memory per batch only).
READ_BATCH = 4096


def job_header(model: Any, model_name: str, reader: CorpusReader, dtype: str, shard_size: int, normalize: bool) -> dict:
    """What every embedding of the job depends on and how the corpus is cut: the manifest's header."""
    return {
        "format": FORMAT,
        "version": 1,
        "model": {
            "name": model_name,
            "identity": model_fingerprint(model, with_context=False),
            "contextual": is_contextual(model),
            **load_options(model),  # backend and graph: cde-st-search loads the model as it ran here
        },
        "prompt": document_prompt(model),
        "dimension": int(model.get_embedding_dimension()),
        # Part of the model fingerprint (its config): cde-st-search loads the model with it.
        "max_seq_length": getattr(model, "max_seq_length", None),
        "dtype": dtype,
        "normalized": normalize,
        "shard_size": shard_size,
        "skip_invalid": reader.skip_invalid,
        "corpus": {
            "path": str(reader.path.resolve()),
            "kind": reader.kind,
            "bytes": _corpus_bytes(reader),
            "sha256": reader.content_digest(),
        },
        # As given, before any record is read (an id field left to the default is resolved by reading).
        "reader": {
            "id_field": reader.id_field,
            "text_field": reader.text_field,
            "title_field": reader.title_field,
            "split": reader.split,
        },
    }


def _corpus_bytes(reader: CorpusReader) -> int:
    return sum(path.stat().st_size for path in reader.files)


def _context_request(model: Any, context: str | None, context_size: int | None, seed: int) -> dict | None:
    if not is_contextual(model):
        if context is not None:
            raise ValueError(f"{type(model).__name__} is not a contextual model; it takes no context.")
        return None
    if context in (None, "sample"):
        size = model.contextual_module.context_size if context_size is None else context_size
        if size < 1:
            raise ValueError(f"context_size (--context-size) must be at least 1 document, got {size}.")
        return sample_request(model, size, seed)
    return {"source": "model"} if context == "model" else {"source": "file", "path": str(Path(context).resolve())}


def _saved_context(out_dir: Path, old: dict | None, request: dict | None) -> CorpusContext | None:
    """The folder's own context, when this run asks for the one it has and its file is there, intact."""
    saved = context_path(out_dir, old or {})
    if old is None or not old.get("context") or old["context"]["request"] != request or not saved.is_file():
        return None
    context = read_context_file(saved)
    return context if context.fingerprint == old["context"]["fingerprint"] else None


def _resolve_context(model, request, saved: CorpusContext | None, scan: ScanResult, batch_size) -> CorpusContext:
    """The job's context: the folder's own (``saved``) when there is one, else computed (sample) or read."""
    if saved is not None:
        return saved
    if request["source"] == "sample":
        if not scan.sample:
            raise ValueError("the corpus has no non-blank text to sample a context from.")
        return sampled_context(model, scan, request, batch_size)
    # A cde-st-serve context records the fingerprint of the model as the server loaded it (its saved context
    # included): accept that one, or the context-free fingerprint.
    identities = {model_fingerprint(model), model_fingerprint(model, with_context=False)}
    return given_context(model, "model" if request["source"] == "model" else request["path"], identities)


def finished_shards(out_dir: str | Path, manifest: dict) -> dict[int, dict]:
    """The manifest's shards whose file is there with the recorded SHA-256 (the others are written again)."""
    done = {}
    for entry in manifest.get("shards", []):
        path = Path(out_dir) / entry["file"]
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]:
            done[entry["index"]] = entry
    return done


def embed_corpus(
    model: Any,
    corpus_path: str | Path,
    out_dir: str | Path,
    *,
    model_name: str | None = None,
    context: str | None = None,
    context_size: int | None = None,
    seed: int = 0,
    shard_size: int = 10_000,
    batch_size: int = 32,
    dtype: str = "float32",
    devices: list[str] | None = None,
    ray_workers: int | None = None,
    normalize: bool = False,
    skip_invalid: bool = False,
    reader_options: dict[str, Any] | None = None,
    show_progress_bar: bool = True,
) -> dict[str, Any]:
    """Embed every document of ``corpus_path`` with ``model`` (and one corpus context) into ``out_dir``; return
    the manifest. Rerun the same call after a crash to finish the job (see the module docstring).

    Args:
        model: a ``ContextualSentenceTransformer`` or a plain ``SentenceTransformer`` (no context).
        corpus_path: JSON lines, parquet, a BEIR folder or a ``datasets`` folder (:class:`CorpusReader`).
        out_dir: the output folder (created; a folder of another job, or a non-empty one no job wrote, is refused:
            :mod:`cde_st.corpus.output_folder`).
        model_name: how the manifest names the model (default: its class).
        context: None / ``"sample"`` (J documents of the corpus, seeded), ``"model"`` (the model's saved context)
            or a context file (``.npy``, ``.safetensors``; a ``cde-st-serve`` named context file).
        context_size: J of a sampled context (default: the model's).
        seed: the sample's seed.
        shard_size: stream positions per shard (the unit of resumption).
        batch_size: documents per forward pass.
        dtype: ``"float32"``, ``"float16"`` or ``"int8"`` (per-row scale).
        devices: one process per device through sentence-transformers' pool (``["cpu", "cpu"]``,
            ``["cuda:0", "cuda:1"]``); None or one device: this process.
        ray_workers: embed with Ray Data on this many model actors instead (:mod:`cde_st.corpus.ray_encoder`;
            the ``distributed`` extra).
        normalize: L2-normalise the embeddings before storing them.
        skip_invalid: leave bad records out (counted in the manifest) instead of raising.
        reader_options: ``id_field``, ``text_field``, ``title_field``, ``split`` of :class:`CorpusReader`.

    Raises:
        cde_st.data.DataError: a bad record (file and line named), unless ``skip_invalid``.
        cde_st.corpus.manifest.ForeignOutputError: ``out_dir`` holds another job's embeddings (another model,
            context, corpus content or reader field).
        FileExistsError: ``out_dir`` is a file, or a non-empty folder that no job wrote.
    """
    _check_options(dtype, shard_size, batch_size, devices, ray_workers)
    reader = CorpusReader(corpus_path, skip_invalid=skip_invalid, **(reader_options or {}))
    request = _context_request(model, context, context_size, seed)
    with OutputFolder(out_dir) as folder:
        out_dir = folder.path
        model.eval()
        old = read_manifest(out_dir)
        header = job_header(model, model_name or type(model).__name__, reader, dtype, shard_size, normalize)
        if old is not None:
            check_same_job(out_dir, old, {**header, "context": old.get("context")})
        folder.remove_leftovers()
        # The pool's workers load while this process scans and embeds the context (a finished job needs none).
        with WorkerPool(model, None if (old or {}).get("complete") else devices) as pool:
            manifest = _prepare(model, reader, out_dir, header, request, old, batch_size, show_progress_bar)
            workers = {"ray_workers": ray_workers} if ray_workers is not None else {"devices": devices, "pool": pool}
            _write_shards(model, reader, out_dir, manifest, workers, batch_size, show_progress_bar)
        return manifest


def _check_options(
    dtype: str, shard_size: int, batch_size: int, devices: list[str] | None, ray_workers: int | None
) -> None:
    """A ValueError for options of :func:`embed_corpus` that cannot go together or are out of range."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"shard_size and batch_size must be >= 1, got {shard_size} and {batch_size}.")
    if ray_workers is not None and devices:
        raise ValueError("give devices= (one machine's pool) or ray_workers= (Ray), not both.")


#: What a rerun keeps of the folder's manifest besides its header: its version, where its files are, its history.
_CARRIED = ("generation", "context_file", "drift", "history")


def sample_request(model: Any, size: int, seed: int) -> dict:
    """The request of a context of ``size`` documents sampled from the corpus with ``seed``. For a model that reads
    the order of its context rows (:func:`cde_st.context.reads_context_order`: cde-small-v2) it also holds
    ``order: "corpus"``: the sample's rows are then in corpus order, as ``set_context`` gives them. A sample request
    without ``order`` is in hash order, as every folder written before the order was kept has it, whatever the model."""
    request = {"source": "sample", "size": int(size), "seed": int(seed)}
    if reads_context_order(contextual_module(model)):
        request["order"] = "corpus"
    return request


def sample_for(request: dict | None) -> BottomKSample | None:
    """The scan's sample for a context ``request`` (None unless the context is sampled from the corpus), in the
    order the request asks for."""
    if request is None or request["source"] != "sample":
        return None
    return BottomKSample(request["size"], request["seed"], keep_order=request.get("order") == "corpus")


def sampled_rows(scan: ScanResult, request: dict) -> list[str]:
    """The context rows of a sampled ``request``: the scan's bottom-k sample (in hash or corpus order, as the request
    asks), tiled evenly to the size asked for when the corpus has fewer distinct documents
    (:func:`cde_st.context.tile_sample`), as ``sample_context`` does."""
    return tile_sample(scan.sample, request["size"], request["seed"])


def sampled_context(model: Any, scan: ScanResult, request: dict, batch_size: int) -> CorpusContext:
    """The context of a sampled ``request``: its rows (:func:`sampled_rows`) prompted and embedded by ``model``."""
    texts, size, seed = sampled_rows(scan, request), request["size"], request["seed"]
    return embed_sampled_context(model, texts, context_prompt(model), size, seed, batch_size, request.get("order"))


def _prepare(model, reader, out_dir, header, request, old, batch_size, show_progress_bar) -> dict:
    """The scan and the context (reused from the folder when this run asks for what it has), in the manifest."""
    if old is not None:
        check_sample_order(out_dir, old, request)
    saved = _saved_context(out_dir, old, request)
    if old is not None and old.get("scan") is not None:
        scan = ScanResult(**old["scan"])
        # Another sample was asked for (scanned to name its fingerprint in the refusal), or the folder's own is
        # missing or damaged (sampled again: the same rows, checked by their fingerprint).
        if saved is None and request is not None and request["source"] == "sample":
            scan = scan_corpus(reader, out_dir, sample_for(request), show_progress_bar)
    else:
        scan = scan_corpus(reader, out_dir, sample_for(request), show_progress_bar)
        check_not_empty(reader, scan)
    context = None if request is None else _resolve_context(model, request, saved, scan, batch_size)
    manifest = {**header, "context": None if context is None else context.describe(), "scan": scan.to_dict()}
    if old is not None:
        check_same_job(out_dir, old, manifest)
        manifest["shards"] = old.get("shards", [])
        manifest.update({key: old[key] for key in _CARRIED if key in old})
    else:
        manifest["shards"] = []
    generation = manifest.get("generation", 0)
    if context is not None:
        manifest["context_file"] = manifest.get("context_file", versioned_name(CONTEXT_FILE, generation))
        context.save(out_dir / manifest["context_file"])
    manifest["complete"] = False
    write_manifest(out_dir, manifest)
    return manifest


def check_not_empty(reader: CorpusReader, scan: ScanResult) -> None:
    """Refuse a corpus without a valid record (there is nothing to embed), naming it."""
    where = reader.path if reader.kind == "datasets" else reader.files[0]
    if scan.records == 0:
        raise DataError(f"{where}: the corpus has no records (an empty file?); there is nothing to embed.")
    if scan.valid == 0:
        raise DataError(
            f"{where}: none of the corpus's {scan.records} records is valid (skipped: {scan.skipped}); there is "
            "nothing to embed."
        )


def make_encoder(model: Any, context, workers: dict, batch_size: int, normalize: bool):
    """The encoder of the shards: in process or on a pool of devices (``workers["devices"]``, or a started
    :class:`WorkerPool` as ``workers["pool"]``), or on Ray actors (``workers["ray_workers"]``); a context manager."""
    if workers.get("ray_workers") is not None:
        from cde_st.corpus.ray_encoder import RayEncoder

        return RayEncoder(model, context, workers["ray_workers"], batch_size, normalize)
    return DocumentEncoder(model, context, workers.get("devices"), batch_size, normalize, workers.get("pool"))


def _write_shards(model, reader, out_dir: Path, manifest: dict, workers, batch_size: int, show_progress_bar) -> None:
    shard_size, scan = manifest["shard_size"], manifest["scan"]
    n_shards = math.ceil(scan["records"] / shard_size)
    done = finished_shards(out_dir, manifest)
    manifest["shards"] = sorted(done.values(), key=lambda e: e["index"])
    pending = [k for k in range(n_shards) if k not in done]
    context = read_context_file(out_dir / manifest["context_file"]).vectors if manifest["context"] else None
    drift = manifest.get("drift")
    reference = DriftReference.load(out_dir / drift["reference_file"]) if drift else None
    bar = tqdm(
        total=scan["valid"],
        initial=sum(e["rows"] for e in done.values()),
        desc="Embedding",
        unit=" docs",
        disable=not show_progress_bar,
        smoothing=0.1,
    )
    if pending:
        with make_encoder(model, context, workers, batch_size, manifest["normalized"]) as encoder:
            # Several shards per call where the encoder gains from it (Ray starts its actors once per call).
            records = shard_records(reader, pending, shard_size, set(scan["duplicate_positions"]))
            for group in _groups(records, encoder.shards_per_call):
                embedded = encoder.encode_shards([texts for _, _, texts in group if texts])
                for k, ids, texts in group:
                    embeddings = embedded.pop(0) if texts else np.zeros((0, manifest["dimension"]), np.float32)
                    rows = (ids, [content_hash(t) for t in texts], embeddings)
                    entry = record_shard(out_dir, manifest, k, rows, reference)
                    manifest["shards"] = sorted([*manifest["shards"], entry], key=lambda e: e["index"])
                    write_manifest(out_dir, manifest)
                    bar.update(len(ids))
    bar.close()
    _finish(out_dir, manifest, n_shards)
    write_manifest(out_dir, manifest)


def _finish(out_dir: Path, manifest: dict, n_shards: int) -> None:
    """Mark the manifest complete; the first time, make the drift reference from the stored embeddings (with the
    share of the corpus unlike it, the baseline drift is measured from) and the first entry of the history."""
    manifest["complete"] = True
    manifest["counts"] = {"embedded": sum(e["rows"] for e in manifest["shards"]), "shards": n_shards}
    if manifest["context"] is not None and manifest.get("drift") is None:
        attach_reference(out_dir, manifest, (manifest["context"].get("request") or {}).get("seed", 0))
    drift = manifest.get("drift")
    if not manifest.get("history"):
        embedded = manifest["counts"]["embedded"]
        counts = {"added": embedded, "changed": 0, "deleted": 0, "unchanged": 0}
        add_history(manifest, "embed", counts, 0.0 if drift is not None else None)


def record_shard(out_dir: Path, manifest: dict, k: int, rows: tuple, reference: DriftReference | None) -> dict:
    """Write shard ``k`` (``rows``: ids, content hashes, embeddings) atomically under this version's name; return
    its manifest entry, with the count of rows unlike the drift reference."""
    name = versioned_name(shard_name(k), manifest.get("generation", 0))
    entry = write_shard(out_dir, name, k, manifest["shard_size"], rows, manifest["dtype"])
    if reference is not None:  # scored as stored (as a reader sees it), like the shards the reference was made from
        stored = rows[2] if manifest["dtype"] == "float32" else read_shard(out_dir / name, entry["sha256"])[1]
        entry["below"] = reference.count_below(stored)
    return entry


def _groups(items: Iterator, size: int) -> Iterator[list]:
    group = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def shard_records(
    reader: CorpusReader, pending: list[int], shard_size: int, duplicates: set[int]
) -> Iterator[tuple[int, list[str], list[str]]]:
    """(shard index, ids, texts) of each pending shard, in order, from one read of the stream (from the first
    pending shard on); records whose id came earlier (``duplicates``, skip mode) are left out."""
    wanted = set(pending)
    current, ids, texts = pending[0], [], []
    for batch in reader.batches(READ_BATCH, start=pending[0] * shard_size):
        for position, doc_id, text in zip(batch.positions, batch.ids, batch.texts):
            k = position // shard_size
            while k != current:  # the current shard is complete (maybe empty): hand it over
                if current in wanted:
                    yield current, ids, texts
                    wanted.discard(current)
                current, ids, texts = current + 1, [], []
            if current in wanted and position not in duplicates:
                ids.append(doc_id)
                texts.append(text)
    for k in sorted(wanted):  # the last shard, and trailing shards without one valid record
        yield (k, ids, texts) if k == current else (k, [], [])
