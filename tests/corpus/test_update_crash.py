"""An update killed at any point: the folder reads as the old version until the switch, and the same update run again
finishes it, row for row what a clean full run writes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
from corpus_helpers import DOCS, all_rows, write_jsonl
from preloaded_python import start_python

from cde_st.corpus import embed_corpus, read_manifest
from cde_st.corpus.index import build_index, search_index
from cde_st.corpus.update import update_corpus
from cde_st.corpus.versions import PENDING_FILE, read_pending

REPO = Path(__file__).resolve().parents[2]

UPDATE = """
import sys, torch
from cde_st import ContextualSentenceTransformer
from cde_st.corpus.update import update_corpus
torch.manual_seed(0)
model = ContextualSentenceTransformer.from_encoder(sys.argv[1], context_size=8, max_seq_length=64, output_head="mlp",
    first_stage_residual=False, context_attention="joint").eval()
update_corpus(model, sys.argv[2], sys.argv[3], batch_size=8, show_progress_bar=False)
"""


def _versions(out: Path, generation: int) -> list[Path]:
    return sorted(out.glob(f"shard-*.v{generation}.parquet"))


def test_kill_9_during_an_update_leaves_the_old_version_readable_and_a_rerun_finishes_it(
    make_tiny_cde, tiny_bert_dir, tmp_path
):
    model = make_tiny_cde(context_size=8)  # the job's model: same seed, same config
    docs = [{"_id": f"x{i}", "text": f"text {i} " + "word " * (i % 40)} for i in range(1500)]
    out = tmp_path / "out"
    embed_corpus(model, write_jsonl(tmp_path / "v1.jsonl", docs), out, shard_size=50, show_progress_bar=False)
    build_index(out, show_progress_bar=False)
    old_ids, old_rows = all_rows(out)
    # Every shard changes: the first ten documents go, every text is edited, twenty are appended.
    new_docs = [{**d, "text": d["text"] + " edited"} for d in docs[10:]]
    new_docs += [{"_id": f"y{i}", "text": f"added {i}"} for i in range(20)]
    corpus = write_jsonl(tmp_path / "v2.jsonl", new_docs)
    # From the forkserver that imported sentence-transformers (a fresh interpreter where the environment asks for
    # one); the repository root as working directory puts cde_st on the path of a "-c" program.
    log, env = tmp_path / "update.log", {**os.environ, "OMP_NUM_THREADS": "1"}
    job = start_python(["-c", UPDATE, tiny_bert_dir, corpus, str(out)], log=log, cwd=REPO, env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(_versions(out, 1)) < 3:  # kill once a few new shards are written
        assert job.poll() is None, log.read_text()
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL

    # Half done: the manifest is the old version's, which reads and searches as before.
    live = read_manifest(out)
    assert live.get("generation", 0) == 0 and live["complete"]
    ids, rows = all_rows(out)
    assert ids == old_ids and np.array_equal(rows, old_rows)
    assert {i for i, _ in search_index(out, model, ["text 3"], k=1500)[0]} == set(old_ids)
    pending = read_pending(out)
    written = {e["file"]: (out / e["file"]).stat().st_mtime_ns for e in pending["shards"]}
    assert written and len(written) < 31

    manifest = update_corpus(model, corpus, out, batch_size=8, show_progress_bar=False)
    assert {f: (out / f).stat().st_mtime_ns for f in written} == written  # the finished new shards were kept
    full = embed_corpus(
        model, corpus, tmp_path / "full", context=str(out / "context.safetensors"), shard_size=50, batch_size=8,
        show_progress_bar=False,
    )  # fmt: skip
    ids, rows = all_rows(out)
    full_ids, full_rows = all_rows(tmp_path / "full")
    assert ids == full_ids == [d["_id"] for d in new_docs]
    np.testing.assert_allclose(rows, full_rows, rtol=0, atol=1e-6)
    assert manifest["generation"] == 1 and manifest["counts"] == full["counts"]
    assert manifest["history"][-1]["changed"] == 1490 and manifest["history"][-1]["deleted"] == 10
    assert not (out / PENDING_FILE).exists() and not list(out.glob("shard-??????.parquet"))


def test_what_a_killed_switch_or_another_updates_half_left_is_removed(tiny_cde, tmp_path):
    out = tmp_path / "out"
    embed_corpus(tiny_cde, write_jsonl(tmp_path / "v1.jsonl", DOCS), out, shard_size=25, show_progress_bar=False)
    build_index(out, show_progress_bar=False)
    corpus = write_jsonl(tmp_path / "v2.jsonl", DOCS[3:])
    # Another update (of another corpus), killed after its first shard: its pending record and file.
    shutil.copy(out / "shard-000000.parquet", out / "shard-000000.v1.parquet")
    stale = {**read_manifest(out), "generation": 1, "corpus": {"sha256": "0" * 64}}
    stale["shards"] = [{**stale["shards"][0], "file": "shard-000000.v1.parquet"}]
    stale["pending"] = {"base_generation": 0, "kind": "update", "request": None}
    (out / PENDING_FILE).write_text(json.dumps(stale))
    manifest = update_corpus(tiny_cde, corpus, out, show_progress_bar=False)
    ids, _ = all_rows(out)
    assert ids == [d["_id"] for d in DOCS[3:]] and manifest["history"][-1]["deleted"] == 3
    # A switch killed before it removed the old version's files: the next run removes them.
    (out / "shard-000007.parquet").write_bytes(b"left by the old version")
    (out / "index.v9.faiss").write_bytes(b"left")
    (out / "notes.txt").write_text("the user's")
    update_corpus(tiny_cde, corpus, out, show_progress_bar=False)
    names = {p.name for p in out.iterdir()}
    assert "shard-000007.parquet" not in names and "index.v9.faiss" not in names and "notes.txt" in names
