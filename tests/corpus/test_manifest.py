"""The manifest of an embedding folder: read and written whole, a damaged or foreign one named, a rerun of another
job refused naming both values, and the history of the runs that made a version."""

from __future__ import annotations

import copy
import json

import pytest

from cde_st.corpus import DamagedFileError, ForeignOutputError, read_manifest
from cde_st.corpus.manifest import (
    FORMAT,
    HISTORY_LENGTH,
    MANIFEST_FILE,
    add_history,
    check_same_embedding,
    check_same_job,
    write_manifest,
)

HEADER = {
    "format": FORMAT,
    "model": {"name": "tiny", "identity": "model-a"},
    "context": {"fingerprint": "context-a"},
    "prompt": "passage: ",
    "dimension": 32,
    "dtype": "float32",
    "shard_size": 25,
    "corpus": {"path": "/data/c.jsonl", "bytes": 1000, "sha256": "aa" * 32},
    "reader": {"id_field": None, "text_field": "text", "title_field": "title", "split": None},
    "skip_invalid": False,
}


def _with(path: tuple[str, ...], value) -> dict:
    changed = copy.deepcopy(HEADER)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def test_a_manifest_reads_back_as_written_and_a_folder_without_one_has_none(tmp_path):
    assert read_manifest(tmp_path) is None
    write_manifest(tmp_path, HEADER)
    assert read_manifest(tmp_path) == HEADER
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]  # written whole, no temporary file left


def test_an_unreadable_manifest_is_named(tmp_path):
    path = tmp_path / MANIFEST_FILE
    path.write_bytes(b'{"format": "cde_st.embedded_corpus", "sha')
    with pytest.raises(DamagedFileError, match=rf"{path} is not readable JSON .*manifest is damaged"):
        read_manifest(tmp_path)
    path.write_bytes(b"\xff\xfe not text")
    with pytest.raises(DamagedFileError, match=rf"{path} is not readable JSON"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(("content", "found"), [({"format": "other.tool"}, "'other.tool'"), ([1, 2], "'list'")])
def test_a_manifest_of_another_tool_is_refused_naming_its_format(tmp_path, content, found):
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(content))
    with pytest.raises(ForeignOutputError, match=rf"is not a cde-st-embed manifest \(format {found}\)"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("model", "identity"), "model-b", "its model fingerprint is 'model-a', this run's is 'model-b'"),
        (("prompt",), "", "its prompt is 'passage: ', this run's is ''"),
        (("dtype",), "int8", "its dtype is 'float32', this run's is 'int8'"),
        (("shard_size",), 10, "its shard size is 25, this run's is 10"),
        (("corpus", "bytes"), 999, "its corpus size in bytes is 1000, this run's is 999.*Pass --update"),
        (("reader", "split"), "test", r"its split \(--split\) is None, this run's is 'test'"),
    ],
)
def test_a_rerun_of_another_job_is_refused_naming_both_values(path, value, message):
    check_same_job("out", HEADER, copy.deepcopy(HEADER))  # the same job continues
    with pytest.raises(ForeignOutputError, match=rf"out holds embeddings of another job: {message}"):
        check_same_job("out", HEADER, _with(path, value))


def test_a_corpus_edited_to_the_same_size_or_another_context_is_refused_naming_both():
    with pytest.raises(
        ForeignOutputError, match=rf"changed since out was written: same size.*{'aa' * 32} then, b+ now"
    ):
        check_same_job("out", HEADER, _with(("corpus", "sha256"), "b" * 64))
    with pytest.raises(
        ForeignOutputError, match="context fingerprint context-a; this run's context fingerprint is none"
    ):
        check_same_job("out", HEADER, {**HEADER, "context": None})


def test_fields_a_folder_was_written_without_are_not_compared():
    old = copy.deepcopy(HEADER)
    del old["reader"], old["corpus"]["sha256"]  # recorded since a later version
    check_same_job("out", old, _with(("reader", "text_field"), "body"))
    del old["prompt"]  # always recorded: its absence is a difference
    with pytest.raises(ForeignOutputError, match="its prompt is None"):
        check_same_job("out", old, HEADER)


def test_an_update_may_change_the_corpus_and_context_but_not_how_it_embeds():
    new = {**_with(("corpus", "sha256"), "b" * 64), "context": {"fingerprint": "context-b"}}
    new["corpus"]["bytes"] = 5
    check_same_embedding("out", HEADER, new)
    with pytest.raises(ForeignOutputError, match="its dimension is 32, this run's is 16"):
        check_same_embedding("out", HEADER, {**new, "dimension": 16})


def test_the_history_keeps_the_last_runs():
    manifest = {"shards": [{"rows": 3}, {"rows": 4}], "corpus": {"sha256": "ab"}, "generation": 2}
    for i in range(HISTORY_LENGTH + 5):
        add_history(manifest, "update", {"added": i}, 1.23456)
    assert len(manifest["history"]) == HISTORY_LENGTH == 20
    assert [e["added"] for e in manifest["history"]][:2] == [5, 6]
    last = manifest["history"][-1]
    assert (last["kind"], last["documents"], last["corpus_sha256"], last["generation"]) == ("update", 7, "ab", 2)
    assert last["drift_percent"] == 1.235
    add_history(manifest, "embed", {}, None)
    assert manifest["history"][-1]["drift_percent"] is None and manifest["history"][-1]["when"].endswith("+00:00")
