"""A damaged or missing file of an embedding folder (shard, index, ids) is named, with how to write it again,
instead of a raw parquet / faiss / JSON error or a silently wrong index."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import all_rows

from cde_st.corpus import DamagedFileError, embed_corpus, read_manifest, read_shard
from cde_st.corpus.index import build_index, search_index

REWRITE = "Rerun cde-st-embed with the same arguments to write it again"
REBUILD = "Rebuild the index: rerun cde-st-embed with the same arguments"


def _flip_a_byte(path) -> None:
    """Flip a byte a third into the file, among the values: parquet may read it back without an error."""
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.fixture
def embedded(tiny_plain, corpus_file, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_plain, corpus_file, out, shard_size=25, show_progress_bar=False)
    return out


def test_a_damaged_or_missing_shard_is_named_when_the_index_is_built(tiny_plain, corpus_file, embedded):
    ids, embeddings = all_rows(embedded)
    shard = embedded / "shard-000001.parquet"
    _flip_a_byte(shard)
    with pytest.raises(DamagedFileError, match=rf"Shard {shard} does not match the SHA-256 .*{REWRITE}"):
        build_index(embedded, show_progress_bar=False)
    entry = read_manifest(embedded)["shards"][1]
    with pytest.raises(DamagedFileError, match="does not match the SHA-256"):
        read_shard(shard, entry["sha256"])
    shard.unlink()
    with pytest.raises(DamagedFileError, match=rf"Shard {shard} is missing. {REWRITE}"):
        build_index(embedded, show_progress_bar=False)
    embed_corpus(tiny_plain, corpus_file, embedded, shard_size=25, show_progress_bar=False)  # as the message says
    assert build_index(embedded, show_progress_bar=False)["rows"] == 60
    again_ids, again = all_rows(embedded)
    assert again_ids == ids and np.array_equal(again, embeddings)


def test_a_truncated_index_or_junk_ids_are_named_with_how_to_rebuild(tiny_plain, embedded):
    build_index(embedded, show_progress_bar=False)
    index, ids = embedded / "index.faiss", embedded / "index_ids.parquet"
    whole_index, whole_ids = index.read_bytes(), ids.read_bytes()
    index.write_bytes(whole_index[:100])
    with pytest.raises(DamagedFileError, match=rf"{index} cannot be read as a faiss index .*{REBUILD}"):
        search_index(embedded, tiny_plain, ["rain"])
    index.write_bytes(whole_index)
    ids.write_bytes(b"junk")
    with pytest.raises(DamagedFileError, match=rf"{ids} cannot be read as the index's ids .*{REBUILD}"):
        search_index(embedded, tiny_plain, ["rain"])
    ids.unlink()
    with pytest.raises(DamagedFileError, match=rf"index_ids\.parquet is missing\. {REBUILD}"):
        search_index(embedded, tiny_plain, ["rain"])
    ids.write_bytes(whole_ids)
    assert len(search_index(embedded, tiny_plain, ["rain"], k=3)[0]) == 3
