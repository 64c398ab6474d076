"""Shards of an embedded corpus: parquet files of ``id`` and ``embedding``, each written so that a crash at any point
leaves either no file or a whole one.

A shard is serialised in memory, hashed (SHA-256, recorded in the manifest), written to a temporary name in the
same folder, fsynced, renamed into place, and the folder fsynced. A file whose hash does not match the manifest, or
that the manifest does not list, is not a finished shard and is written again.

Columns: ``id`` (string) and ``embedding``, a fixed-size list of ``dimension`` values: float32, float16, or int8 with
a per-row float32 ``scale`` column (``embedding * scale`` gives the vector back to within half a step of 1/127 of
the row's largest value).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

__all__ = [
    "DTYPES",
    "TEMP_PREFIX",
    "DamagedFileError",
    "fsync_dir",
    "read_shard",
    "shard_bytes",
    "shard_name",
    "shard_table",
    "write_atomically",
]

DTYPES = ("float32", "float16", "int8")
TEMP_PREFIX = ".tmp-"


class DamagedFileError(ValueError):
    """A file of an embedding folder (manifest, shard, index) is missing or damaged; the message names it and how
    to write it again."""


def shard_name(index: int) -> str:
    """The file name of shard ``index``."""
    return f"shard-{index:06d}.parquet"


def shard_table(ids: list[str], embeddings: np.ndarray, dtype: str = "float32"):
    """A pyarrow table of one shard: ``id``, ``embedding`` (fixed-size list) and, for int8, ``scale``."""
    import pyarrow as pa

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
    embeddings = np.asarray(embeddings, dtype=np.float32)
    n, dimension = embeddings.shape
    columns = {"id": pa.array(ids, type=pa.string())}
    if dtype == "int8":
        scale = np.abs(embeddings).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        values = np.clip(np.rint(embeddings / scale[:, None]), -127, 127).astype(np.int8)
        value_type = pa.int8()
    else:
        values, value_type = embeddings.astype(dtype), pa.from_numpy_dtype(np.dtype(dtype))
    flat = pa.array(values.reshape(-1), type=value_type)
    columns["embedding"] = pa.FixedSizeListArray.from_arrays(flat, dimension)
    if dtype == "int8":
        columns["scale"] = pa.array(scale.astype(np.float32))
    return pa.table(columns)


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder, so a rename in it survives a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | Path, data: bytes) -> str:
    """Write ``data`` to ``path`` through a fsynced temporary file and a rename; return its SHA-256 (hex)."""
    path = Path(path)
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return hashlib.sha256(data).hexdigest()


def shard_bytes(table) -> bytes:
    """A table serialised as parquet (zstd), in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def read_shard(path: str | Path, sha256: str | None = None) -> tuple[list[str], np.ndarray]:
    """(ids, (n, d) float32 embeddings) of one shard (int8 shards dequantised with their scale).

    ``sha256``: the hash the manifest records for the shard; a file that does not match it (or is missing) raises
    :class:`DamagedFileError`, since parquet reads most flipped bytes of the values without an error.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if sha256 is not None:
        if not path.is_file():
            raise DamagedFileError(f"Shard {path} is missing. {_REWRITE}")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise DamagedFileError(
                f"Shard {path} does not match the SHA-256 its manifest records (it was altered after it was "
                f"written). {_REWRITE}"
            )
        table = pq.read_table(pa.BufferReader(data))
    else:
        table = pq.read_table(path)
    ids = table.column("id").to_pylist()
    column = table.column("embedding").combine_chunks()
    dimension = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, dimension).astype(np.float32)
    if "scale" in table.column_names:
        values *= table.column("scale").to_numpy()[:, None]
    return ids, values


_REWRITE = (
    "Rerun cde-st-embed with the same arguments to write it again (a missing or damaged shard is written again, "
    "then the index), or delete the shard first."
)
