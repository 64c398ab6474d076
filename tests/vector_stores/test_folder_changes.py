"""What a store must change to be level with a folder, shard by shard: new ids added, a changed vector or text
rewritten, ids the folder lost deleted, the rest unchanged; vectors compared bit for bit or within a tolerance."""

from __future__ import annotations

import numpy as np

from cde_st.vector_stores.embedded_folder import FolderRows
from cde_st.vector_stores.folder_changes import FolderChanges, StoreRows

VECTORS = np.arange(12, dtype=np.float32).reshape(4, 3) + 1


def _store(texts=("ta", "tb", "tc", "td")) -> StoreRows:
    return StoreRows({"a": 0, "b": 1, "c": 2, "d": 3}, VECTORS, None if texts is None else list(texts))


def test_rows_are_added_changed_or_unchanged_and_lost_ids_deleted():
    changes = FolderChanges()
    moved = VECTORS[1] + np.float32(1e-3)
    first = FolderRows(["a", "b", "new"], np.stack([VECTORS[0], moved, VECTORS[2]]), ["ta", "tb", "tn"])
    assert changes.to_write(first, _store()) == [1, 2]  # b's vector changed, "new" is not in the store
    second = FolderRows(["c"], VECTORS[2:3], ["an edited text"])
    assert changes.to_write(second, _store()) == [0]  # same vector, other text
    assert changes.deleted_ids(["a", "b", "c", "d", "gone"]) == ["d", "gone"]
    assert changes.counts == {"added": 1, "changed": 2, "deleted": 2, "unchanged": 1}


def test_texts_are_compared_only_where_both_sides_have_them():
    rows = FolderRows(["a", "b"], VECTORS[:2], ["other", "texts"])
    assert FolderChanges().to_write(rows, _store(texts=None)) == []  # the store keeps no texts
    assert FolderChanges().to_write(FolderRows(["a"], VECTORS[:1], None), _store()) == []  # corpus gone


def test_a_store_level_with_the_folder_changes_nothing():
    changes = FolderChanges()
    assert changes.to_write(FolderRows(["a", "b", "c", "d"], VECTORS.copy(), ["ta", "tb", "tc", "td"]), _store()) == []
    assert changes.deleted_ids(["a", "b", "c", "d"]) == []
    assert changes.counts == {"added": 0, "changed": 0, "deleted": 0, "unchanged": 4}


def test_a_tolerance_accepts_rounding_relative_to_the_norm_and_nothing_more():
    norm = float(np.linalg.norm(VECTORS[3]))
    rounded = VECTORS[3:4] + np.float32(2e-7 * norm)
    edited = VECTORS[3:4] + np.float32(5e-7 * norm)
    assert FolderChanges().to_write(FolderRows(["d"], rounded, None), _store()) == [0]  # bit for bit
    assert FolderChanges(tolerance=2.5e-7).to_write(FolderRows(["d"], rounded, None), _store()) == []
    assert FolderChanges(tolerance=2.5e-7).to_write(FolderRows(["d"], edited, None), _store()) == [0]
    zero = StoreRows({"z": 0}, np.zeros((1, 3), np.float32))
    assert FolderChanges(tolerance=2.5e-7).to_write(FolderRows(["z"], np.zeros((1, 3), np.float32), None), zero) == []
    tiny = np.full((1, 3), 1e-9, np.float32)  # near zero: measured against its own small norm
    assert FolderChanges(tolerance=2.5e-7).to_write(FolderRows(["z"], tiny, None), zero) == [0]
