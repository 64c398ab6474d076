"""Local evaluation folders (cde_st/evaluation/local_folders.py): splits per format, folder fingerprints, finding a
task by name under a data directory. Which format a folder holds: test_local_tasks.py (detect_kind)."""

from __future__ import annotations

import pytest
from evaluation_helpers import make_classification, make_retrieval

from cde_st.data import DataError
from cde_st.evaluation.local_folders import (
    TASK_KINDS,
    available_splits,
    detect_kind,
    find_local_task,
    folder_fingerprint,
    list_local_tasks,
)


def test_available_splits_per_format(data_dir):
    assert available_splits(data_dir / "retrieval" / "tinyret", "retrieval") == ["test"]
    assert available_splits(data_dir / "classification" / "tinycls", "classification") == ["test", "train"]
    folder = make_classification(data_dir.parent / "more")
    (folder / "dev.jsonl.gz").write_bytes(b"")  # compressed splits count too
    assert available_splits(folder, "classification") == ["dev", "test", "train"]


def test_fingerprint_follows_content_and_names(tmp_path):
    folder = make_retrieval(tmp_path)
    first = folder_fingerprint(folder)
    assert first == folder_fingerprint(folder) and len(first) == 12
    qrels = folder / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q5\td0\t1\n")
    second = folder_fingerprint(folder)
    assert second != first
    qrels.rename(folder / "qrels" / "dev.tsv")  # same bytes under another name: another dataset
    assert folder_fingerprint(folder) != second


def test_find_a_task_by_path_or_by_name(data_dir, tmp_path):
    assert find_local_task("tinysts", data_dir) == data_dir / "sts" / "tinysts"
    assert find_local_task(str(data_dir / "sts" / "tinysts"), None) == data_dir / "sts" / "tinysts"
    assert find_local_task("nothing", data_dir) is None
    assert find_local_task("tinysts", None) is None
    assert find_local_task("sts", data_dir) is None  # a type folder is not a task
    (data_dir / "loose").mkdir()
    assert find_local_task("loose", data_dir) == data_dir / "loose"  # directly under the data directory


def test_list_tasks_of_a_data_directory(data_dir, tmp_path):
    assert list_local_tasks(data_dir) == ["tinycls", "tinyclu", "tinypair", "tinyret", "tinysts"]
    assert list_local_tasks(tmp_path / "missing") == list_local_tasks(None) == []
    assert len(TASK_KINDS) == 5


def test_a_folder_without_evaluation_files_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no evaluation files found"):
        detect_kind(tmp_path / "empty")
    with pytest.raises(DataError, match="not a folder"):
        detect_kind(tmp_path / "missing")
