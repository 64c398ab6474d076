"""Shards of an embedded corpus: parquet files of ``id`` and ``embedding``, each written so that a crash at any point
leaves either no file or a whole one.

A shard is serialised in memory, hashed (SHA-256, recorded in the manifest), written to a temporary name in the
same folder, fsynced, renamed into place, and the folder fsynced. A file whose hash does not match the manifest, or
that the manifest does not list, is not a finished shard and is written again.

Columns: ``id`` (string), ``embedding``, a fixed-size list of ``dimension`` values: float32, float16, or int8 with
a per-row float32 ``scale`` column (``embedding * scale`` gives the vector back to within half a step of 1/127 of
the row's largest value), and ``content_hash`` (16 bytes, :func:`content_hash` of the text the model read): what an
update compares to tell an unchanged document from an edited one without keeping the texts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from cde_st.atomic_files import TEMP_PREFIX, fsync_dir
from cde_st.atomic_files import write_atomically as _replace_file

__all__ = [
    "DTYPES",
    "TEMP_PREFIX",
    "HASH_COLUMN",
    "DamagedFileError",
    "content_hash",
    "fsync_dir",
    "read_shard",
    "read_shard_keys",
    "shard_bytes",
    "shard_name",
    "shard_table",
    "write_atomically",
    "write_shard",
]

DTYPES = ("float32", "float16", "int8")
#: The column of each row's content hash.
HASH_COLUMN = "content_hash"


class DamagedFileError(ValueError):
    """A file of an embedding folder (manifest, shard, index) is missing or damaged; the message names it and how
    to write it again."""


def shard_name(index: int) -> str:
    """The file name of shard ``index``."""
    return f"shard-{index:06d}.parquet"


def content_hash(text: str) -> bytes:
    """16 bytes that change when the text a model reads (title + text, as read) changes."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def shard_table(ids: list[str], embeddings: np.ndarray, dtype: str = "float32", hashes: list[bytes] | None = None):
    """A pyarrow table of one shard: ``id``, ``embedding`` (fixed-size list), for int8 ``scale``, and
    ``content_hash`` when ``hashes`` are given."""
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
    if hashes is not None:
        columns[HASH_COLUMN] = pa.array(hashes, type=pa.binary(16))
    return pa.table(columns)


def write_atomically(path: str | Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically (:func:`cde_st.atomic_files.write_atomically`, fsynced); return its
    SHA-256 (hex), which the manifest records."""
    _replace_file(path, data)
    return hashlib.sha256(data).hexdigest()


def write_shard(
    folder: str | Path,
    name: str,
    index: int,
    shard_size: int,
    rows: tuple[list[str], list[bytes], np.ndarray],
    dtype: str,
) -> dict:
    """Write shard ``index`` (``rows``: ids, content hashes, embeddings) as ``folder / name``, atomically; return
    its manifest entry (file, positions, rows, SHA-256)."""
    ids, hashes, embeddings = rows
    digest = write_atomically(Path(folder) / name, shard_bytes(shard_table(ids, embeddings, dtype, hashes)))
    start = index * shard_size
    return {
        "index": index,
        "file": name,
        "start": start,
        "stop": start + shard_size,
        "rows": len(ids),
        "sha256": digest,
    }


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


def read_shard_keys(path: str | Path) -> tuple[list[str], list[bytes | None]]:
    """(ids, content hashes) of a shard, without its embeddings; hashes are None in a shard written before they
    were recorded (an update then embeds its rows again)."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    columns = ["id", HASH_COLUMN] if HASH_COLUMN in schema.names else ["id"]
    table = pq.read_table(path, columns=columns)
    ids = table.column("id").to_pylist()
    hashes = table.column(HASH_COLUMN).to_pylist() if HASH_COLUMN in columns else [None] * len(ids)
    return ids, hashes


_REWRITE = (
    "Rerun cde-st-embed with the same arguments to write it again (a missing or damaged shard is written again, "
    "then the index), or delete the shard first."
)
