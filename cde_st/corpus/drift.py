"""How far a corpus has moved from the documents its context was made from: the *drift* of an embedded corpus.

Once a corpus is embedded with a new context, a reference sample of its stored embeddings is kept
(:func:`attach_reference`): up to :data:`REFERENCE_SIZE` rows drawn at random (seeded), and as many others to
calibrate with; nothing is embedded again. A document is *unlike the reference* when its highest cosine to the
reference rows is below the threshold: the :data:`CALIBRATION_PERCENTILE` th percentile of that highest cosine over
the calibration documents (documents of the corpus outside the reference), so about 5% of the corpus is below it
when the context is made. Each shard entry of the manifest counts its rows below the threshold (an update scores
the shards it writes as it writes them), so the share of the corpus below is read from the manifest without reading
a shard.

Drift is that share now minus the share when the reference was made, in percentage points: "12% of the corpus is
unlike the documents its context was made from". A corpus that gains documents of its own kind stays near 0; one
that gains another domain's documents moves with the share they take (a neighbouring domain by less: MED
appended to SciFact by about 0.3 of its share). :data:`RESAMPLE_ADVISED` is a provisional
threshold for re-sampling the context (``cde-st-embed ... --recontextualize``).

Example (a benchmark's hook)::

    from cde_st.corpus.drift import corpus_drift
    drift = corpus_drift("corpus-emb")                 # the folder as its last update left it
    print(drift.percent, drift.message())
    mixed = corpus_drift("corpus-emb", embeddings=e)   # any (n, d) embeddings, scored against the reference
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cde_st.corpus.manifest import read_manifest
from cde_st.corpus.shards import read_shard, write_atomically
from cde_st.corpus.versions import versioned_name

__all__ = [
    "CALIBRATION_PERCENTILE",
    "REFERENCE_FILE",
    "REFERENCE_METADATA_KEY",
    "REFERENCE_SIZE",
    "RESAMPLE_ADVISED",
    "Drift",
    "DriftReference",
    "attach_reference",
    "corpus_drift",
    "manifest_drift",
    "rows_below",
]

#: The metadata key that marks a reference file as one a job wrote.
REFERENCE_METADATA_KEY = "cde_st_drift_reference"
#: The file of the reference sample, beside the manifest (``.v{g}`` for later versions: :mod:`.versions`).
REFERENCE_FILE = "drift_reference.safetensors"
#: Reference rows (and as many calibration rows): a shard of 10,000 rows of dimension 768 scores against 1,024 in
#: 0.46 s on one CPU thread (measured).
REFERENCE_SIZE = 1024
#: The calibration percentile: the share of a corpus like the reference that falls below the threshold.
CALIBRATION_PERCENTILE = 5.0
#: Drift (percentage points) from which re-sampling the context is advised. Provisional: on SciFact (800 documents)
#: appending up to 50% more of its own documents moved the drift by at most 1.2 points, and MED documents by 9.3 when
#: they were a third of the corpus (benchmarks/embed/RESULTS_embed.md, "Drift on mixed corpora"); whether the
#: quality a fresh context recovers follows the drift was not measurable there (an untrained model).
RESAMPLE_ADVISED = 10.0
_CHUNK = 4096


def _normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


@dataclass
class DriftReference:
    """The reference rows (L2-normalised, (R, d)) and the threshold a document's highest cosine to them is
    compared with."""

    vectors: np.ndarray
    threshold: float
    calibration_size: int

    @classmethod
    def from_embeddings(cls, embeddings: np.ndarray) -> DriftReference:
        """Rows in sample order: even ranks become the reference, odd ranks calibrate the threshold."""
        embeddings = _normalised(embeddings)
        reference, calibration = embeddings[0::2], embeddings[1::2]
        made = cls(reference, -1.0, len(calibration))
        if len(calibration):
            made.threshold = float(np.percentile(made.highest_cosine(calibration), CALIBRATION_PERCENTILE))
        return made

    def highest_cosine(self, embeddings: np.ndarray) -> np.ndarray:
        """(n,) each row's highest cosine to the reference rows."""
        embeddings = _normalised(embeddings)
        out = np.empty(len(embeddings), dtype=np.float32)
        for start in range(0, len(embeddings), _CHUNK):
            out[start : start + _CHUNK] = (embeddings[start : start + _CHUNK] @ self.vectors.T).max(axis=1)
        return out

    def count_below(self, embeddings: np.ndarray) -> int:
        """How many rows are unlike the reference (highest cosine below the threshold)."""
        if not len(embeddings):
            return 0
        return int((self.highest_cosine(embeddings) < self.threshold).sum())

    def save(self, path: str | Path) -> None:
        """Write the reference (vectors, threshold in the metadata) atomically."""
        from safetensors.numpy import save

        meta = {
            REFERENCE_METADATA_KEY: "1",
            "threshold": repr(self.threshold),
            "calibration_size": str(self.calibration_size),
        }
        write_atomically(path, save({"vectors": np.ascontiguousarray(self.vectors)}, meta))

    @classmethod
    def load(cls, path: str | Path) -> DriftReference:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            vectors, meta = f.get_tensor("vectors"), f.metadata() or {}
        return cls(vectors, float(meta["threshold"]), int(meta["calibration_size"]))

    def describe(self, file: str) -> dict[str, Any]:
        """The manifest's record of the reference (the share when made is added once the corpus is embedded)."""
        return {
            "reference_file": file,
            "reference_rows": int(len(self.vectors)),
            "calibration_rows": self.calibration_size,
            "threshold": self.threshold,
            "percentile": CALIBRATION_PERCENTILE,
        }


def attach_reference(folder: str | Path, manifest: dict[str, Any], seed: int = 0) -> None:
    """Make the drift reference of the version ``manifest`` describes, from its stored embeddings (no document is
    embedded again): up to ``2 * REFERENCE_SIZE`` rows drawn at random (seeded), even draws the reference and odd
    ones the calibration. Saved under the version's name; each shard entry gets its count of rows below the
    threshold and ``manifest["drift"]`` the record, the share below now being the baseline. Two reads of the shards."""
    folder, shards = Path(folder), [e for e in manifest["shards"] if e["rows"]]
    total = sum(e["rows"] for e in shards)
    draws = np.random.default_rng(seed).choice(total, min(total, 2 * REFERENCE_SIZE), replace=False)
    order = np.argsort(draws)
    drawn = draws[order]  # positions in corpus order; order[i] is the draw of the i-th of them
    picked = np.zeros((len(draws), manifest["dimension"]), dtype=np.float32)
    start = 0
    for entry in shards:
        low, high = np.searchsorted(drawn, [start, start + entry["rows"]])
        if high > low:
            _, vectors = read_shard(folder / entry["file"], entry["sha256"])
            picked[order[low:high]] = vectors[drawn[low:high] - start]
        start += entry["rows"]
    reference = DriftReference.from_embeddings(picked)
    for entry in manifest["shards"]:
        stored = read_shard(folder / entry["file"], entry["sha256"])[1] if entry["rows"] else np.zeros((0, 1))
        entry["below"] = reference.count_below(stored)
    name = versioned_name(REFERENCE_FILE, manifest.get("generation", 0))
    reference.save(folder / name)
    below = sum(e["below"] for e in manifest["shards"])
    manifest["drift"] = {**reference.describe(name), "seed": seed, "baseline_share": below / total if total else 0.0}


def rows_below(shards: list[dict]) -> tuple[int, int | None]:
    """(rows, rows below the threshold) over manifest shard entries (None when a shard has no count)."""
    rows = sum(entry["rows"] for entry in shards)
    counts = [entry.get("below") for entry in shards]
    return rows, None if any(c is None for c in counts) else sum(counts)


@dataclass
class Drift:
    """The drift of a corpus: ``below`` of ``rows`` documents are unlike the reference; ``baseline`` is the share
    that was when the reference was made."""

    rows: int
    below: int
    baseline: float
    threshold: float

    @property
    def share(self) -> float:
        """The share of the corpus below the threshold now (0 to 1)."""
        return self.below / self.rows if self.rows else 0.0

    @property
    def percent(self) -> float:
        """Drift in percentage points: the share below now minus the share when the reference was made."""
        return 100.0 * (self.share - self.baseline)

    @property
    def advised(self) -> bool:
        """Whether re-sampling the context is advised (:data:`RESAMPLE_ADVISED`, provisional)."""
        return self.percent >= RESAMPLE_ADVISED

    def message(self) -> str:
        advice = "re-sampling the context is advised" if self.advised else "the context still describes it"
        return (
            f"Drift {self.percent:.1f}%: {self.percent:.1f}% of the corpus is unlike the documents its context was "
            f"made from ({self.below:,} of {self.rows:,} documents below the threshold now, {100 * self.baseline:.1f}% "
            f"when the context was made); {advice} (from {RESAMPLE_ADVISED:g}%, provisional)."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "drift_percent": round(self.percent, 3),
            "share_below": self.share,
            "baseline_share": self.baseline,
            "rows": self.rows,
            "below": self.below,
            "threshold": self.threshold,
            "resample_advised": self.advised,
            "resample_advised_from_percent": RESAMPLE_ADVISED,
        }


def corpus_drift(out_dir: str | Path, embeddings: np.ndarray | None = None) -> Drift | None:
    """The drift of the embedded corpus in ``out_dir`` (from the manifest's counts, as its last run left it), or
    of ``embeddings`` ((n, d), e.g. a mixed corpus embedded with the folder's context) scored against its
    reference. None when the folder has no reference (a plain model, or a folder written before drift was
    measured; ``--recontextualize`` makes one)."""
    folder = Path(out_dir)
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder}: no manifest.json (not a cde-st-embed folder).")
    record = manifest.get("drift")
    if embeddings is None or not record or record.get("baseline_share") is None:
        return manifest_drift(manifest)
    reference = DriftReference.load(folder / record["reference_file"])
    embeddings = np.asarray(embeddings, dtype=np.float32)
    return Drift(len(embeddings), reference.count_below(embeddings), record["baseline_share"], reference.threshold)


def manifest_drift(manifest: dict[str, Any]) -> Drift | None:
    """The drift of the shards a manifest lists (None without a reference or without counts)."""
    record = manifest.get("drift")
    if not record or record.get("baseline_share") is None:
        return None
    rows, below = rows_below(manifest["shards"])
    return None if below is None else Drift(rows, below, record["baseline_share"], record["threshold"])
