"""benchmarks/quality/corpus_statistics.py and its pieces: the generated domains are deterministic, built as the
benchmark says (a query is words of its document plus the domain's noise), written in the formats the trainer and
the eval kit read; BM25 with the domain's own IDF beats BM25 without it, which is what the benchmark rests on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from preloaded_python import run_python

from cde_st.data import load_beir

QUALITY = Path(__file__).resolve().parents[2] / "benchmarks" / "quality"
sys.path.insert(0, str(QUALITY))
sys.path.insert(0, str(QUALITY.parent))

from bm25_idf import bm25_scores, ndcg_at_10, term_counts  # noqa: E402
from synthetic_domains import DomainSpec, make_domain, read_vocabulary  # noqa: E402

WORDS = [f"{a}{b}{c}" for a in "bcdfg" for b in "aeiou" for c in "klmnprst"]  # 200 made-up words


@pytest.fixture
def vocab_file(tmp_path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "##ing", "a", *WORDS]) + "\n", encoding="utf-8")
    return path


def test_domains_are_deterministic_and_built_as_documented(vocab_file):
    vocab = read_vocabulary(vocab_file, 100, seed=0)
    assert len(vocab) == 100 and set(vocab) <= set(WORDS)  # whole words of 3+ letters only
    assert read_vocabulary(vocab_file, 100, seed=0) == vocab != read_vocabulary(vocab_file, 100, seed=1)
    spec = DomainSpec(vocab_size=100, doc_words=12, query_words=2, noise_words=3)
    one = make_domain(vocab, spec, index=5, seed=0, documents=30, queries=20)
    assert one == make_domain(vocab, spec, index=5, seed=0, documents=30, queries=20)
    assert one.documents != make_domain(vocab, spec, index=6, seed=0, documents=30, queries=20).documents
    assert len(set(one.targets)) == 20  # one query per document at most
    for query, target in zip(one.queries, one.targets):
        words = query.split()
        assert len(words) == 5
        document = set(one.documents[target].split())
        assert len(set(words) & document) >= 2  # its two document words (noise may hit the document too)
    with pytest.raises(ValueError, match="asked for 500"):
        read_vocabulary(vocab_file, 500, seed=0)


def test_bm25_scores_rank_the_matching_document_first():
    vocab = {w: i for i, w in enumerate(["aa", "bb", "cc", "dd"])}
    documents = term_counts(["aa aa bb", "cc dd", "aa cc"], vocab)
    scores = bm25_scores(term_counts(["dd"], vocab), documents, idf=np.ones(4))
    assert int(scores.argmax()) == 1
    assert ndcg_at_10(scores, [1]) == 100.0
    assert ndcg_at_10(np.zeros((1, 3)), [1]) == pytest.approx(100 / np.log2(4))  # a tie is ranked against the target


def test_generate_writes_pairs_beir_folders_and_a_domain_idf_gap(vocab_file, tmp_path):
    out = tmp_path / "data"
    args = ["generate", "--out", str(out), "--vocab-file", str(vocab_file), "--vocab-size", "150", "--doc-words",
            "20", "--train-domains", "6", "--train-pairs", "16", "--heldout-domains", "3", "--docs", "120",
            "--queries", "60"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = run_python([str(QUALITY / "corpus_statistics.py"), *args], env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 6 * 16 and len({row["domain"] for row in rows}) == 6
    assert all(set(row) == {"query", "document", "domain"} for row in rows)
    folders = sorted((out / "heldout").iterdir())
    assert len(folders) == 3
    data = load_beir(folders[0], "test")
    assert len(data.corpus) == 120 and len(data.queries) == 60 and len(data.qrels) == 60
    generator = json.loads((out / "generator.json").read_text())
    assert generator["vocab_size"] == 150 and len(generator["vocabulary"]) == 150
    bm25 = json.loads((out / "bm25.json").read_text())
    assert bm25["bm25_domain_idf"]["mean"] > bm25["bm25_no_idf"]["mean"] + 3  # the corpus tells something
