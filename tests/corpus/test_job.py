"""embed_corpus: one context for the whole corpus, shards equal to in-process embeddings, resume, refusals."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus_helpers import DOCS, TEXTS, all_rows, write_jsonl
from preloaded_python import start_python

from cde_st.corpus import ForeignOutputError, embed_corpus, read_context_file, read_manifest
from cde_st.data import DataError

REPO = Path(__file__).resolve().parents[2]


def test_shards_hold_the_in_process_embeddings_with_the_recorded_context(tiny_cde, corpus_file, tmp_path):
    manifest = embed_corpus(tiny_cde, corpus_file, tmp_path / "out", shard_size=25, show_progress_bar=False)
    assert manifest["complete"] and manifest["counts"] == {"embedded": 60, "shards": 3}
    assert [e["rows"] for e in manifest["shards"]] == [25, 25, 10]
    assert manifest["context"]["size"] == 8 and manifest["context"]["source"] == "sample"
    assert manifest["prompt"] == tiny_cde.prompts["document"] and manifest["dimension"] == 32
    ids, embeddings = all_rows(tmp_path / "out")
    assert ids == [d["_id"] for d in DOCS]
    context = read_context_file(tmp_path / "out" / "context.safetensors")
    assert context.fingerprint == manifest["context"]["fingerprint"]
    expected = tiny_cde.encode_document(TEXTS, context_vectors=torch.tensor(context.vectors))
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)
    # a rerun of a finished job writes nothing
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("shard-*")}
    embed_corpus(tiny_cde, corpus_file, tmp_path / "out", shard_size=25, show_progress_bar=False)
    assert mtimes == {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("shard-*")}


def test_the_sample_depends_on_the_corpus_as_a_set_not_its_order_nor_the_workers(tiny_cde, tmp_path):
    shuffled = DOCS[:]
    random.Random(1).shuffle(shuffled)
    a = embed_corpus(tiny_cde, write_jsonl(tmp_path / "a.jsonl", DOCS), tmp_path / "a", show_progress_bar=False)
    b = embed_corpus(
        tiny_cde,
        write_jsonl(tmp_path / "b.jsonl", shuffled),
        tmp_path / "b",
        shard_size=20,
        devices=["cpu", "cpu"],
        show_progress_bar=False,
    )
    assert a["context"]["fingerprint"] == b["context"]["fingerprint"]
    assert a["context"]["texts_fingerprint"] == b["context"]["texts_fingerprint"]
    ids_a, emb_a = all_rows(tmp_path / "a")
    ids_b, emb_b = all_rows(tmp_path / "b")
    order = [ids_b.index(i) for i in ids_a]
    np.testing.assert_allclose(emb_b[order], emb_a, atol=1e-5)  # 2 pool workers = 1 process
    other_seed = embed_corpus(tiny_cde, tmp_path / "a.jsonl", tmp_path / "c", seed=1, show_progress_bar=False)
    assert other_seed["context"]["fingerprint"] != a["context"]["fingerprint"]


def test_a_folder_of_another_model_or_context_is_refused_naming_both_fingerprints(make_tiny_cde, corpus_file, tmp_path):
    model = make_tiny_cde(context_size=8)
    first = embed_corpus(model, corpus_file, tmp_path / "out", show_progress_bar=False)
    other = make_tiny_cde(context_size=8, seed=1)
    with pytest.raises(ForeignOutputError, match="model fingerprint") as err:
        embed_corpus(other, corpus_file, tmp_path / "out", show_progress_bar=False)
    assert first["model"]["identity"] in str(err.value)
    with pytest.raises(ForeignOutputError, match="context fingerprint") as err:
        embed_corpus(model, corpus_file, tmp_path / "out", seed=3, show_progress_bar=False)
    assert first["context"]["fingerprint"] in str(err.value)
    assert read_manifest(tmp_path / "out")["context"] == first["context"]  # the refused runs changed nothing
    with open(corpus_file, "a") as f:
        f.write(json.dumps({"_id": "new", "text": "a document added later"}) + "\n")
    with pytest.raises(ForeignOutputError, match="corpus size in bytes"):
        embed_corpus(model, corpus_file, tmp_path / "out", show_progress_bar=False)


def test_repeated_ids_are_named_by_both_lines_or_skipped(tiny_cde, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [*DOCS[:5], {**DOCS[7], "_id": "d2"}, *DOCS[5:7]])
    with pytest.raises(DataError, match=r"c\.jsonl:6: duplicate id 'd2' \(first at .*c\.jsonl:3\)"):
        embed_corpus(tiny_cde, path, tmp_path / "out", show_progress_bar=False)
    manifest = embed_corpus(tiny_cde, path, tmp_path / "skip", skip_invalid=True, show_progress_bar=False)
    assert manifest["scan"]["skipped"] == {"duplicate id": 1}
    ids, _ = all_rows(tmp_path / "skip")
    assert ids == ["d0", "d1", "d2", "d3", "d4", "d5", "d6"]


def test_a_plain_model_embeds_without_a_context(tiny_plain, corpus_file, tmp_path):
    manifest = embed_corpus(tiny_plain, corpus_file, tmp_path / "out", dtype="float16", show_progress_bar=False)
    assert manifest["context"] is None and manifest["dtype"] == "float16"
    _, embeddings = all_rows(tmp_path / "out")
    np.testing.assert_allclose(embeddings, tiny_plain.encode_document(TEXTS), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="not a contextual model"):
        embed_corpus(tiny_plain, corpus_file, tmp_path / "ctx", context="model", show_progress_bar=False)


def test_int8_shards_keep_each_row_to_a_step(tiny_cde, corpus_file, tmp_path):
    embed_corpus(tiny_cde, corpus_file, tmp_path / "f", show_progress_bar=False)
    embed_corpus(tiny_cde, corpus_file, tmp_path / "q", dtype="int8", show_progress_bar=False)
    _, exact = all_rows(tmp_path / "f")
    _, quantised = all_rows(tmp_path / "q")
    step = np.abs(exact).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(quantised - exact) <= step / 2 + 1e-6)


def test_a_given_context_file_and_the_models_own(tiny_cde, corpus_file, tmp_path):
    vectors = np.random.default_rng(0).normal(size=(5, 32)).astype(np.float32)
    np.save(tmp_path / "ctx.npy", vectors)
    manifest = embed_corpus(
        tiny_cde, corpus_file, tmp_path / "f", context=str(tmp_path / "ctx.npy"), show_progress_bar=False
    )
    assert manifest["context"]["source"] == "file" and manifest["context"]["size"] == 5
    _, embeddings = all_rows(tmp_path / "f")
    np.testing.assert_allclose(embeddings, tiny_cde.encode_document(TEXTS, context_vectors=vectors), atol=1e-5)
    tiny_cde.set_context(TEXTS[:20])
    own = embed_corpus(tiny_cde, corpus_file, tmp_path / "m", context="model", show_progress_bar=False)
    assert own["context"]["source"] == "model" and own["context"]["size"] == 8


def test_a_served_context_of_another_model_is_refused(tiny_cde, corpus_file, tmp_path):
    from safetensors.numpy import save_file

    meta = {"name": "docs", "fingerprint": "f", "size": 4, "seed": 0, "model_identity": "0123456789abcdef"}
    path = tmp_path / "docs.safetensors"
    save_file({"vectors": np.zeros((4, 32), np.float32)}, str(path), {"cde_st_serving_context": json.dumps(meta)})
    with pytest.raises(ValueError, match="made by another model.*0123456789abcdef"):
        embed_corpus(tiny_cde, corpus_file, tmp_path / "out", context=str(path), show_progress_bar=False)


def test_a_shard_file_the_manifest_does_not_list_or_that_is_damaged_is_written_again(tiny_cde, corpus_file, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_cde, corpus_file, out, shard_size=25, show_progress_bar=False)
    ids, embeddings = all_rows(out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"] = manifest["shards"][:1]  # as if killed after shard 1's rename, before its manifest write
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-000000.parquet").write_bytes(b"half a file")
    (out / ".tmp-shard-000002.parquet.123").write_bytes(b"left by a crash")
    embed_corpus(tiny_cde, corpus_file, out, shard_size=25, show_progress_bar=False)
    again_ids, again = all_rows(out)
    assert again_ids == ids and np.array_equal(again, embeddings)
    assert not list(out.glob(".tmp-*"))


JOB = """
import sys, torch
from cde_st import ContextualSentenceTransformer
from cde_st.corpus import embed_corpus
torch.manual_seed(0)
model = ContextualSentenceTransformer.from_encoder(sys.argv[1], context_size=8, max_seq_length=64, output_head="mlp",
    first_stage_residual=False, context_attention="joint").eval()
embed_corpus(model, sys.argv[2], sys.argv[3], shard_size=50, batch_size=8, show_progress_bar=False)
"""


def test_resume_after_kill_9_at_mid_run_gives_the_uninterrupted_output(tiny_bert_dir, tmp_path, monkeypatch):
    docs = [{"_id": f"x{i}", "text": f"text {i} " + "word " * (i % 40)} for i in range(1500)]
    corpus = write_jsonl(tmp_path / "c.jsonl", docs)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(out: Path):
        # From the forkserver that imported sentence-transformers (a fresh interpreter where the environment asks
        # for one); the repository root as working directory puts cde_st on the path of a "-c" program.
        log = tmp_path / f"{out.name}-{time.monotonic_ns()}.log"
        return start_python(["-c", JOB, tiny_bert_dir, corpus, str(out)], log=log, cwd=REPO, env=env), log

    # The uninterrupted output: the same job run in this process, on one thread like the job's processes.
    monkeypatch.setattr(sys, "argv", ["job.py", tiny_bert_dir, corpus, str(tmp_path / "whole")])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        exec(compile(JOB, "job.py", "exec"), {"__name__": "__main__"})
    finally:
        torch.set_num_threads(threads)
    job, log = run(tmp_path / "killed")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # kill once some shards are finished, none being the last
        manifest = read_manifest(tmp_path / "killed") if (tmp_path / "killed" / "manifest.json").exists() else None
        if manifest and len(manifest.get("shards", [])) >= 3:
            break
        assert job.poll() is None, log.read_text()
        time.sleep(0.01)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL
    assert not read_manifest(tmp_path / "killed")["complete"]
    resumed, log = run(tmp_path / "killed")
    assert resumed.wait(timeout=300) == 0, log.read_text()
    ids, embeddings = all_rows(tmp_path / "killed")
    whole_ids, whole = all_rows(tmp_path / "whole")
    assert ids == whole_ids == [d["_id"] for d in docs]
    assert np.array_equal(embeddings, whole)


def test_the_pool_starts_while_the_context_is_embedded_and_not_for_a_finished_job(
    tiny_cde, corpus_file, tmp_path, monkeypatch
):
    # The workers take seconds to start (sentence-transformers' start waits for each to read the model): started
    # first and in a thread, they load while this process scans and embeds the context.
    import threading

    import cde_st.corpus.job as job

    events, context_done = [], threading.Event()

    class Stop(Exception):
        pass

    def start(devices):  # runs on the snapshot the pool is started from, in the pool's thread
        events.append(("pool", list(devices), context_done.wait(timeout=30)))
        return {"input": None, "output": None, "processes": []}

    def embed_context(*args, **kwargs):
        events.append(("context", threading.current_thread() is threading.main_thread()))
        context_done.set()
        raise Stop

    monkeypatch.setattr(tiny_cde, "start_multi_process_pool", start)
    monkeypatch.setattr(tiny_cde, "stop_multi_process_pool", lambda pool: events.append(("stopped",)))
    monkeypatch.setattr(job, "embed_sampled_context", embed_context)
    with pytest.raises(Stop):
        embed_corpus(tiny_cde, corpus_file, tmp_path / "out", devices=["cpu", "cpu"], show_progress_bar=False)
    # the start was under way when the context was embedded (it saw the context finish), then the pool stopped
    assert events == [("context", True), ("pool", ["cpu", "cpu"], True), ("stopped",)]
    monkeypatch.undo()
    embed_corpus(tiny_cde, corpus_file, tmp_path / "done", show_progress_bar=False)
    events.clear()
    monkeypatch.setattr(tiny_cde, "start_multi_process_pool", start)
    embed_corpus(tiny_cde, corpus_file, tmp_path / "done", devices=["cpu", "cpu"], show_progress_bar=False)
    assert events == []  # a finished job embeds nothing: no worker is started
