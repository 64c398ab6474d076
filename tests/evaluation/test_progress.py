"""What an evaluation says while it runs: which task and step, how many texts, and the context each step uses (the
encoder's own bar then counts the batches with a time estimate)."""

from __future__ import annotations

import json
import logging

from cde_st.evaluation import evaluate_model


def _beir_folder(root, name="toybeir"):
    folder = root / name
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"topic {i % 6} study number {i}"} for i in range(36)]
    queries = [{"_id": f"q{i}", "text": f"what is new in topic {i % 6}?"} for i in range(8)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = "".join(f"q{i}\td{i + 6 * k}\t1\n" for i in range(8) for k in range(2))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def test_evaluation_logs_each_task_and_step_with_its_counts(tmp_path, make_tiny_cde, caplog):
    folder = _beir_folder(tmp_path)
    model = make_tiny_cde(context_size=8)
    with caplog.at_level(logging.INFO, logger="cde_st"):
        evaluate_model(model, [folder], context_size=4, output_dir=None, show_progress_bar=True)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("cde_st.evaluation")]
    assert any(line.startswith("Task 1 of 1: evaluating ") and "toybeir" in line for line in lines), lines
    assert "toybeir: embedding the context, 4 documents (first stage)" in lines
    assert "toybeir (test): encoding 8 queries with a context of 4 documents" in lines
    assert "toybeir (test): encoding 36 documents with a context of 4 documents" in lines


def test_a_quiet_evaluation_logs_no_steps(tmp_path, make_tiny_cde, caplog):
    folder = _beir_folder(tmp_path)
    with caplog.at_level(logging.INFO, logger="cde_st"):
        evaluate_model(
            make_tiny_cde(context_size=8), [folder], context_size=4, output_dir=None, show_progress_bar=False
        )
    assert not [r for r in caplog.records if "encoding" in r.getMessage()]
