"""Shared data of the corpus tests: a small corpus, a JSON-lines writer and the rows of an output folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from cde_st.corpus import read_manifest, read_shard
from cde_st.data import document_text

DOCS = [
    {
        "_id": f"d{i}",
        "title": f"topic {i % 5}",
        "text": f"document {i} says {'rain clouds' if i % 2 else 'sun'} {i % 7}",
    }
    for i in range(60)
]
TEXTS = [document_text(d["title"], d["text"]) for d in DOCS]


def write_jsonl(path, records) -> str:
    """Write records (dicts, or raw str / bytes lines) as a JSON-lines file (gzip by suffix)."""
    lines = [r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in records]
    data = b"\n".join(lines) + b"\n"
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def all_rows(out_dir) -> tuple[list[str], np.ndarray]:
    """The ids and embeddings of every shard of an output folder, in shard order."""
    manifest = read_manifest(out_dir)
    parts = [read_shard(Path(out_dir) / entry["file"]) for entry in manifest["shards"]]
    return [i for ids, _ in parts for i in ids], np.concatenate([e for _, e in parts])


def as_if_killed(out_dir, keep: int = 1) -> None:
    """Make a finished folder look like a job killed after its first ``keep`` shards (the manifest lists only them)."""
    path = Path(out_dir) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:keep], False
    path.write_text(json.dumps(manifest))
