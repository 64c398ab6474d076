"""A faiss index of an embedded corpus, beside its manifest, and the search that reads it with the same model and
context.

The index kind follows the corpus size (:func:`choose_index`): exact search (``IndexFlatIP``) up to
:data:`EXACT_MAX` vectors; above, an inverted file (``IVF{nlist},Flat``, ``nlist`` about 4 sqrt(n), a query visiting
a quarter of the lists), and above :data:`IVF_FLAT_MAX` an inverted file of product-quantised codes
(``IVF{nlist},PQ{m}``, ``m`` bytes a vector) so the index fits in memory. Scores are cosine similarities (vectors
L2-normalised). The index is trained on a sample of at most ``TRAIN_PER_LIST * nlist`` vectors and filled a shard at
a time.

:func:`search_index` encodes queries with the model's query prompt and the corpus context the manifest records,
after checking the model is the one that embedded the corpus (:class:`~cde_st.corpus.manifest.ForeignOutputError`,
naming both fingerprints, otherwise).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from cde_st.context import fingerprint_array
from cde_st.corpus.corpus_context import context_path, read_context_file
from cde_st.corpus.drift import RESAMPLE_ADVISED, manifest_drift
from cde_st.corpus.manifest import ForeignOutputError, read_manifest, write_manifest
from cde_st.corpus.shards import DamagedFileError, read_shard, write_atomically
from cde_st.corpus.versions import versioned_name
from cde_st.fingerprints import model_fingerprint
from cde_st.model import is_contextual

__all__ = [
    "INDEX_FILE",
    "IDS_FILE",
    "TRAIN_PER_LIST",
    "EXACT_MAX",
    "IVF_FLAT_MAX",
    "build_index",
    "choose_index",
    "keeps_quantiser",
    "search_index",
    "write_index",
]

INDEX_FILE = "index.faiss"
IDS_FILE = "index_ids.parquet"
#: Up to this many vectors, exact search (a query costs n dot products: milliseconds).
EXACT_MAX = 50_000
#: Up to this many vectors, IVF keeps full vectors; above, PQ codes.
IVF_FLAT_MAX = 2_000_000
#: Training vectors per inverted list (faiss warns below 39).
TRAIN_PER_LIST = 64


def choose_index(n: int, dimension: int, kind: str = "auto") -> dict[str, Any]:
    """The index for ``n`` vectors of ``dimension``: ``kind`` ``"auto"`` (by size, see the module docstring),
    ``"flat"``, ``"ivf"`` or ``"ivfpq"``; returns ``{"kind", "factory", "nlist", "nprobe"}``."""
    if kind == "auto":
        kind = "flat" if n <= EXACT_MAX else ("ivf" if n <= IVF_FLAT_MAX else "ivfpq")
    if kind == "flat":
        return {"kind": "flat", "factory": "Flat", "nlist": None, "nprobe": None}
    if kind not in ("ivf", "ivfpq"):
        raise ValueError(f"index kind must be auto, flat, ivf or ivfpq, got {kind!r}.")
    nlist = max(1, min(int(4 * math.sqrt(n)), n // 39 or 1))
    # A quarter of the lists: recall@10 0.97 against exact search on SciFact (nlist / 16: 0.84; RESULTS_embed.md).
    nprobe = max(1, min(nlist, math.ceil(nlist / 4)))
    if kind == "ivf":
        return {"kind": "ivf", "factory": f"IVF{nlist},Flat", "nlist": nlist, "nprobe": nprobe}
    m = next(m for m in (dimension // 4, dimension // 8, 16, 8, 4, 2, 1) if m >= 1 and dimension % m == 0)
    return {"kind": "ivfpq", "factory": f"IVF{nlist},PQ{m}", "nlist": nlist, "nprobe": nprobe}


def _normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


def _training_sample(folder: Path, shards: list[dict], size: int, seed: int) -> np.ndarray:
    """``size`` vectors spread over the shards (a seeded choice in each, in proportion to its rows)."""
    total = sum(e["rows"] for e in shards)
    rng = np.random.default_rng(seed)
    parts = []
    for entry in shards:
        if entry["rows"]:
            _, vectors = read_shard(folder / entry["file"], entry["sha256"])
            take = min(len(vectors), math.ceil(size * entry["rows"] / total))
            parts.append(vectors[np.sort(rng.choice(len(vectors), take, replace=False))])
    return _normalised(np.concatenate(parts))


def build_index(out_dir: str | Path, kind: str = "auto", seed: int = 0, show_progress_bar: bool = True) -> dict:
    """Build the faiss index of a finished embedding folder, save it beside the manifest (``index.faiss`` and the
    ids in ``index_ids.parquet``; ``.v{g}`` names in a later version) and record it in the manifest; return that
    record."""
    folder = Path(out_dir)
    manifest = read_manifest(folder)
    if manifest is None or not manifest.get("complete"):
        raise ValueError(f"{folder}: no finished embedding job (run cde-st-embed to the end first).")
    before = manifest.get("index") or {}
    manifest["index"] = write_index(folder, manifest, kind, seed, show_progress_bar)
    write_manifest(folder, manifest)
    for key in ("file", "ids_file"):  # an index of an earlier version, superseded now the manifest names this one
        if before.get(key) and before[key] != manifest["index"][key]:
            (folder / before[key]).unlink(missing_ok=True)
    return manifest["index"]


def write_index(
    folder: Path,
    manifest: dict,
    kind: str = "auto",
    seed: int = 0,
    show_progress_bar: bool = True,
    previous: dict | None = None,
) -> dict:
    """Build the index of the shards ``manifest`` lists (which need not be the folder's live manifest yet: an update
    builds the index of its new version before switching to it), write its files under the version's names and
    return the manifest's record of it.

    ``previous``: the record of the index of the version before, whose trained quantiser (IVF centroids, PQ
    codebooks) is kept when it still fits (:func:`keeps_quantiser`); the vectors are added again either way, in
    the version's row order."""
    import faiss
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, dimension, shards = sum(e["rows"] for e in manifest["shards"]), manifest["dimension"], manifest["shards"]
    if n == 0:
        raise ValueError(f"{folder}: the corpus has no embedded document to index.")
    choice = choose_index(n, dimension, kind)
    print(f"Index: {choice['kind']} ({choice['factory']}) for {n:,} vectors of dimension {dimension}.")
    quantiser = "none"
    if previous is not None and keeps_quantiser(previous, choice, manifest):
        index = faiss.read_index(str(folder / previous["file"]))
        index.reset()  # the vectors go, the trained centroids (and codebooks) stay
        choice = {**choice, **{key: previous[key] for key in ("factory", "nlist", "nprobe")}}
        quantiser = "kept"
    else:
        index = faiss.index_factory(dimension, choice["factory"], faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(_training_sample(folder, shards, TRAIN_PER_LIST * choice["nlist"], seed))
            quantiser = "trained"
    if hasattr(index, "nprobe"):
        index.nprobe = choice["nprobe"]
    ids: list[str] = []
    for entry in tqdm(shards, desc="Indexing shards", disable=not show_progress_bar):
        shard_ids, vectors = read_shard(folder / entry["file"], entry["sha256"])
        if len(shard_ids):
            index.add(_normalised(vectors))
            ids.extend(shard_ids)
    generation = manifest.get("generation", 0)
    files = {"file": versioned_name(INDEX_FILE, generation), "ids_file": versioned_name(IDS_FILE, generation)}
    write_atomically(folder / files["file"], faiss.serialize_index(index).tobytes())
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array(ids, pa.string())}), sink)
    write_atomically(folder / files["ids_file"], sink.getvalue().to_pybytes())
    return {**choice, **files, "rows": len(ids), "metric": "cosine", "requested": kind, "quantiser": quantiser}


def keeps_quantiser(previous: dict, choice: dict, manifest: dict) -> bool:
    """Whether a new version's IVF index keeps the previous version's trained quantiser: the same kind, a list
    count within a factor of 2 of what the new size asks for (lists stay 39 to 256 training vectors deep), and a
    corpus that has not drifted as far as re-sampling is advised (centroids fit to the documents the context was
    made from; a corpus moved further leaves some lists overfull and recall lower). Else it is trained again."""
    if choice["kind"] == "flat" or previous.get("kind") != choice["kind"] or not previous.get("nlist"):
        return False
    if not 0.5 <= choice["nlist"] / previous["nlist"] <= 2.0:
        return False
    drift = manifest_drift(manifest)
    return drift is not None and drift.percent < RESAMPLE_ADVISED


def _check_model(folder: Path, manifest: dict, model: Any) -> None:
    have, want = model_fingerprint(model, with_context=False), manifest["model"]["identity"]
    if have != want:
        raise ForeignOutputError(
            f"{folder} was embedded by model {manifest['model']['name']} (fingerprint {want}); the model given has "
            f"fingerprint {have}. Its queries would not land in the corpus's embedding space: search with that model."
        )


def _corpus_context(folder: Path, manifest: dict, context: Any) -> np.ndarray | None:
    """The context queries read: the folder's (checked against the manifest), or ``context`` if it is that one."""
    if manifest["context"] is None:
        return None
    want = manifest["context"]["fingerprint"]
    if context is None:
        path = context_path(folder, manifest)
        vectors, where = read_context_file(path).vectors, f"{path} has"
    else:
        vectors, where = np.asarray(torch.as_tensor(context).detach().cpu(), dtype=np.float32), "the context given has"
    if fingerprint_array(vectors) != want:
        raise ForeignOutputError(
            f"{folder} was embedded with context fingerprint {want}; {where} context fingerprint "
            f"{fingerprint_array(vectors)}. Queries must read the corpus's own context."
        )
    return vectors


@functools.lru_cache(maxsize=2)
def _read_index(path: str, ids_path: str, versions: tuple[int, int]) -> tuple[Any, list[str]]:
    """The index and its ids, read once per version of the files (a search per query reuses them)."""
    import faiss
    import pyarrow.parquet as pq

    try:
        index = faiss.read_index(path)
    except RuntimeError:  # faiss's message is a C++ assertion; what to do is what matters
        raise DamagedFileError(f"{path} cannot be read as a faiss index (truncated or damaged). {_REBUILD}") from None
    try:
        ids = pq.read_table(ids_path, columns=["id"]).column("id").to_pylist()
    except (OSError, ValueError, KeyError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DamagedFileError(f"{ids_path} cannot be read as the index's ids ({err}). {_REBUILD}") from None
    if index.ntotal != len(ids):
        raise DamagedFileError(
            f"{path} holds {index.ntotal} vectors but {ids_path} {len(ids)} ids (one was replaced). {_REBUILD}"
        )
    return index, ids


_REBUILD = (
    "Rebuild the index: rerun cde-st-embed with the same arguments (on a finished folder it only rebuilds the "
    "index), or call cde_st.corpus.index.build_index(DIR)."
)


def _load_index(folder: Path, manifest: dict) -> tuple[Any, list[str]]:
    if "index" not in manifest:
        raise ValueError(f"{folder}: no index yet; build it with build_index() (cde-st-embed builds it by default).")
    path, ids_path = folder / manifest["index"]["file"], folder / manifest["index"]["ids_file"]
    missing = [p.name for p in (path, ids_path) if not p.is_file()]
    if missing:
        raise DamagedFileError(
            f"{folder}: the manifest records an index but {' and '.join(missing)} is missing. {_REBUILD}"
        )
    return _read_index(str(path), str(ids_path), (path.stat().st_mtime_ns, ids_path.stat().st_mtime_ns))


def search_index(
    out_dir: str | Path,
    model: Any,
    queries: list[str],
    k: int = 10,
    nprobe: int | None = None,
    context: Any = None,
    batch_size: int = 32,
) -> list[list[tuple[str, float]]]:
    """The ``k`` nearest documents of each query: ``[[(id, cosine), ...], ...]``, best first.

    Queries are encoded with ``model.encode_query`` and the corpus context of ``out_dir`` (``context``: leave None,
    or give vectors, which must be that context). A model other than the one that embedded the corpus, or another
    context, raises :class:`~cde_st.corpus.manifest.ForeignOutputError` naming both fingerprints. ``nprobe``: the
    inverted lists an IVF index visits (default: the manifest's).
    """
    if k < 1:
        raise ValueError(f"k (-k) must be at least 1, got {k}.")
    if nprobe is not None and nprobe < 1:
        raise ValueError(f"nprobe (--nprobe) must be at least 1, got {nprobe}.")
    folder = Path(out_dir)
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder}: no manifest.json (not a cde-st-embed folder).")
    _check_model(folder, manifest, model)
    vectors = _corpus_context(folder, manifest, context)
    index, ids = _load_index(folder, manifest)
    kwargs: dict[str, Any] = {"batch_size": batch_size, "convert_to_numpy": True, "show_progress_bar": False}
    if is_contextual(model):
        kwargs["context_vectors"] = torch.as_tensor(vectors)
    embedded = _normalised(np.asarray(model.encode_query(list(queries), **kwargs), dtype=np.float32))
    if hasattr(index, "nprobe"):
        index.nprobe = nprobe or manifest["index"]["nprobe"] or 1
    scores, rows = index.search(embedded, min(k, len(ids)))
    return [[(ids[r], float(s)) for r, s in zip(row, score) if r >= 0] for row, score in zip(rows, scores)]
