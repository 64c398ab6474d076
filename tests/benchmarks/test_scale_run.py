"""benchmarks/quality/scale_run.py: its --smoke run trains (d) and (cp) on the same batches to the same step and
scores every row on four BEIR folders without mteb (the real run is on a GPU, which the tests never need)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "scale_run.py"


def test_smoke_run_trains_both_models_and_scores_every_row(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["CDE_ST_CACHE"] = str(tmp_path / "cache")  # the sampler's clustering cache: this run's own
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    assert "errors" not in report, report.get("errors")  # a failing stage is recorded, not raised
    d, cp = report["training"]["(d)"], report["training"]["(cp)"]
    assert d["steps"] == cp["steps"] == report["plan"]["planned_steps"] == 8  # 64 tiny pairs, batch 8
    assert d["pairs_seen"] == cp["pairs_seen"] == 64 and cp["stopped_by"].startswith("the step (d) reached")
    assert report["config_d"]["model"] == "contextual" and report["config_cp"]["model"] == "biencoder"
    for key in ("batch_size", "cluster_size", "max_seq_length", "seed", "learning_rate", "filter_false_negatives"):
        assert report["config_d"][key] == report["config_cp"][key], key
    assert report["config_d"]["query_prompt"] == report["config_cp"]["query_prompt"] == "search_query: "
    rows = [row["row"] for row in report["table"]]
    assert rows == ["(a) zero-shot", "(cp)", "(d) J=0", "(d) J=4", "(d) J=8"]
    for name in ("(d) J=0", "(d) J=4", "(d) J=8"):
        j = int(name.split("=")[1])
        assert all(r["context"]["size"] == j for r in report["scores"][name].values())
    assert all(r["context"] is None for r in report["scores"]["(cp)"].values())
    for row in report["table"]:
        assert set(row) == {"row", "scifact", "med", "cacm", "lisa", "mean"}
        assert all(0 <= row[c] <= 100 for c in ("scifact", "med", "cacm", "lisa"))
    scifact = report["scores"]["(cp)"]["scifact"]
    assert scifact["queries"] == 8 and scifact["documents"] == 40 and scifact["identical_ids_rule"].startswith("keep")
    markdown = (tmp_path / "out" / "scale_run.md").read_text(encoding="utf-8")
    assert "| (d) J=8 |" in markdown and "smoke run" in markdown


def test_any_beir_folder_can_be_scored(tmp_path):
    folder = tmp_path / "extra_corpus"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"a passage number {i} explaining rain"} for i in range(12)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "question about rain"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["CDE_ST_CACHE"] = str(tmp_path / "cache")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--corpora", str(folder), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    assert report["corpora"] == ["extra_corpus"] and "errors" not in report
    assert all(set(row) == {"row", "extra_corpus", "mean"} for row in report["table"])
    assert "| row | extra_corpus | mean of 1 |" in (tmp_path / "out" / "scale_run.md").read_text(encoding="utf-8")
