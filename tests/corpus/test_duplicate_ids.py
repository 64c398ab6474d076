"""Repeated ids found through a SQLite table on disk, within a batch and across batches."""

from __future__ import annotations

from cde_st.corpus.duplicate_ids import DuplicateIds


def test_repeats_are_found_within_and_across_batches_with_where_first_seen(tmp_path):
    path = tmp_path / "ids.sqlite"
    with DuplicateIds(path) as seen:
        assert seen.add_batch(["a", "b"], ["f:1", "f:2"]) == []
        assert seen.add_batch(["c", "a", "c", "d"], ["f:3", "f:4", "f:5", "f:6"]) == [(1, "f:1"), (2, "f:3")]
        assert seen.add_batch(["d"], ["f:7"]) == [(0, "f:6")]  # the batch with repeats was recorded too
        assert path.is_file()
    assert not path.exists()  # scratch space, removed
