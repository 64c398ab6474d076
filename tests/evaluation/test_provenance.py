"""Cached results are reused only for the same data, context and settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evaluation_helpers import (
    TOPICS,
)


def _result_json(out: Path, task: str) -> dict:
    (path,) = list((out / "results").rglob(f"{task}.json"))
    return json.loads(path.read_text())


def test_no_overwrite_reruns_when_the_local_data_changed(data_dir, tmp_path, tiny_bert_dir, caplog):
    """Issue: ``--no-overwrite`` returned the score of the old data after the folder changed (its fingerprint was
    recorded as the dataset revision but never compared)."""
    from cde_st.cli import eval_run

    def argv(out: Path) -> list[str]:
        return [
            *("--model", tiny_bert_dir, "--tasks", "tinyret", "--data-dir", str(data_dir)),
            *("--output-dir", str(out), "--batch-size", "8", "--quiet", "--model-name", "test/tiny"),
        ]

    out = tmp_path / "out"
    assert eval_run(argv(out)) == 0
    old = _result_json(out, "tinyret")
    # the relevance judgements change: every query now points at another document
    qrels = data_dir / "retrieval" / "tinyret" / "qrels" / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{(i + 5) % 12}\t1\n" for i in range(6)))
    assert eval_run(argv(tmp_path / "fresh")) == 0
    fresh = _result_json(tmp_path / "fresh", "tinyret")
    assert fresh["dataset_revision"] != old["dataset_revision"]
    assert fresh["scores"]["test"][0]["ndcg_at_10"] != old["scores"]["test"][0]["ndcg_at_10"]  # the test can fail
    with caplog.at_level("WARNING", logger="cde_st.evaluation.provenance"):
        assert eval_run([*argv(out), "--no-overwrite"]) == 0
    stale = _result_json(out, "tinyret")
    assert stale["dataset_revision"] == fresh["dataset_revision"]
    assert stale["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(fresh["scores"]["test"][0]["ndcg_at_10"])
    assert any("tinyret" in r.getMessage() and "re-running" in r.getMessage() for r in caplog.records)


def test_no_overwrite_reuses_only_matching_data_and_context(data_dir, tmp_path, make_tiny_cde, monkeypatch):
    """Same data and settings: the cached result is reused (nothing encoded). A changed context (here: the
    content of the fixed random corpus, whose file name stays the same) re-runs."""
    from cde_st.evaluation import evaluate_model

    model = make_tiny_cde(context_size=8)
    corpus = tmp_path / "foreign.txt"
    corpus.write_text("\n".join(f"foreign document {i} about {TOPICS[i % 4]}" for i in range(20)) + "\n")
    kwargs = dict(
        data_dir=data_dir,
        output_dir=tmp_path / "out",
        batch_size=8,
        context="random",
        random_corpus=corpus,
        context_size=4,
        show_progress_bar=False,
        model_name="test/tiny-cde",
    )
    first = evaluate_model(model, ["tinysts"], **kwargs)
    assert first.runs[0].cache_notes == {}
    encoded = []
    original = type(model).encode

    def spy(self, *args, **kw):
        encoded.append(1)
        return original(self, *args, **kw)

    monkeypatch.setattr(type(model), "encode", spy)
    again = evaluate_model(model, ["tinysts"], overwrite=False, **kwargs)
    assert encoded == [] and again.score("tinysts") == pytest.approx(first.score("tinysts"), abs=1e-3)  # stored rounded
    assert "reused" in again.runs[0].cache_notes["tinysts"]
    corpus.write_text("\n".join(f"another text {i} on {TOPICS[(i + 1) % 4]}" for i in range(20)) + "\n")
    changed = evaluate_model(model, ["tinysts"], overwrite=False, **kwargs)
    assert encoded and "re-ran" in changed.runs[0].cache_notes["tinysts"]
    assert "context" in changed.runs[0].cache_notes["tinysts"]
    fresh = evaluate_model(model, ["tinysts"], **{**kwargs, "output_dir": None})
    assert changed.score("tinysts") == pytest.approx(fresh.score("tinysts"))
