"""cde_st.training.data_record: a run records its training files (size, sha256) and a resume over changed files
stops naming each one, or continues when allowed."""

from __future__ import annotations

import hashlib
import json

import pytest

from cde_st.cli import train_run
from cde_st.training import DATA_RECORD_FILE, MANIFEST_FILE, ChangedDataError, TrainConfig, data_record
from cde_st.training.data_record import changed_files, check_data_unchanged


def _pairs_file(path, start=0, n=64):
    rows = [
        {"query": f"question {i} about topic {i % 8}", "document": f"passage {i} on topic {i % 8}"} for i in range(n)
    ]
    rows = [{**row, "domain": "even" if i % 2 else "odd"} for i, row in enumerate(rows[start:])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_record_holds_each_files_size_and_hash_and_names_what_it_cannot_hash(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    a = _pairs_file(folder / "a.jsonl")
    big = folder / "b.jsonl"
    big.write_bytes(b'{"query": "q", "document": "d"}\n' * 100_000)  # 3.2 MB: hashed over several blocks
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        (beir / name).write_text(name)
    cfg = TrainConfig(train_data=[str(folder), f"beir:{beir}", "builtin:tiny", "hub:someone/pairs"])
    record = data_record(cfg)
    files = {entry["path"]: entry for entry in record["files"]}
    expected = [a, big, beir / "corpus.jsonl", beir / "queries.jsonl", beir / "qrels" / "train.tsv"]
    assert list(files) == [str(p) for p in expected]  # the BEIR split read (train), not the others
    for path in expected:
        assert files[str(path)]["bytes"] == path.stat().st_size and files[str(path)]["sha256"] == _sha(path)
    assert record["unchecked"] == ["builtin:tiny", "hub:someone/pairs"]


def test_changed_files_names_each_file_gone_new_or_changed_with_old_and_new_size_and_hash():
    old = {"files": [{"path": "a", "bytes": 1, "sha256": "1" * 64}, {"path": "b", "bytes": 2, "sha256": "2" * 64}]}
    new = {"files": [{"path": "a", "bytes": 3, "sha256": "3" * 64}, {"path": "c", "bytes": 4, "sha256": "4" * 64}]}
    assert changed_files(old, new) == [
        f"a: 1 bytes, sha256 {'1' * 12} -> now 3 bytes, sha256 {'3' * 12}",
        f"b: gone (was 2 bytes, sha256 {'2' * 12})",
        f"c: new file (4 bytes, sha256 {'4' * 12})",
    ]
    assert changed_files(old, old) == []


def test_an_unreadable_record_stops_a_resume_unless_changed_data_is_allowed(tmp_path, caplog):
    (tmp_path / DATA_RECORD_FILE).write_text("{ not json")
    current = {"files": [], "unchecked": []}
    with pytest.raises(ChangedDataError, match=rf"{DATA_RECORD_FILE} .*corrupt.*--allow-changed-data"):
        check_data_unchanged(current, [str(tmp_path)])
    with caplog.at_level("WARNING"):
        check_data_unchanged(current, [str(tmp_path)], allow_changed_data=True)
    assert "corrupt" in caplog.text
    check_data_unchanged(current, [str(tmp_path / "no-record-here")])  # an older run recorded nothing


@pytest.mark.slow
def test_resuming_over_a_changed_training_file_stops_naming_it_or_continues_when_allowed(tmp_path, capsys, caplog):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    out = tmp_path / "run"
    argv = ["--preset", "tiny", "--output-dir", str(out), "--set", f"train_data=[{data}]"]
    assert train_run([*argv, "max_steps=2"]) == 0
    record = json.loads((out / DATA_RECORD_FILE).read_text())
    assert record["files"] == [{"path": str(data), "bytes": data.stat().st_size, "sha256": _sha(data)}]
    assert DATA_RECORD_FILE in json.loads((out / MANIFEST_FILE).read_text())["outputs"]
    old_size, old_sha = data.stat().st_size, _sha(data)

    _pairs_file(data, start=8)  # the first 8 pairs removed: the checkpoint's batches are no longer these pairs
    capsys.readouterr()
    assert train_run([*argv, "max_steps=4", "--resume"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: Cannot resume over changed training data") and str(data) in error, error
    assert f"{old_size} bytes, sha256 {old_sha[:12]}" in error and f"{data.stat().st_size} bytes" in error, error
    assert _sha(data)[:12] in error and "--allow-changed-data" in error, error
    assert not (out / "checkpoint-4").exists() and json.loads((out / DATA_RECORD_FILE).read_text()) == record

    with caplog.at_level("WARNING"):
        assert train_run([*argv, "max_steps=4", "--resume", "--allow-changed-data"]) == 0
    assert "Resuming over changed training data" in caplog.text and str(data) in caplog.text
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 4
    assert json.loads((out / DATA_RECORD_FILE).read_text())["files"][0]["sha256"] == _sha(
        data
    )  # what it now trained on
