"""Tiny local data in the five formats of ../shared/data, shared by the evaluation tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from cde_st.evaluation.local_tasks import load_local_task

TOPICS = ["apples are red fruit", "the stock market fell", "rain falls from clouds", "cats chase mice"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def make_retrieval(root: Path, name: str = "tinyret") -> Path:
    folder = root / "retrieval" / name
    corpus = [{"_id": f"d{i}", "title": f"Doc {i}", "text": f"{TOPICS[i % 4]} variant {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"QUERY-ONLY question about {TOPICS[i % 4]}"} for i in range(6)]
    write_jsonl(folder / "corpus.jsonl.gz", corpus)
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in range(6)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return folder


def make_sts(root: Path, name: str = "tinysts") -> Path:
    folder = root / "sts" / name
    rows = [
        {"sentence1": f"{TOPICS[i % 4]} {i}", "sentence2": f"{TOPICS[(i * 3) % 4]} again {i}", "score": float(i % 6)}
        for i in range(10)
    ]
    rows.append(dict(rows[0]))  # a repeated pair: the pool must not count its sentences twice
    write_jsonl(folder / "test.jsonl", rows)
    return folder


def make_classification(root: Path, name: str = "tinycls") -> Path:
    folder = root / "classification" / name
    train = [{"text": f"TRAIN {TOPICS[i % 4]} {i}", "label": ["a", "b", "c", "d"][i % 4]} for i in range(16)]
    test = [{"text": f"TEST {TOPICS[i % 4]} {i}", "label": ["a", "b", "c", "d"][i % 4]} for i in range(8)]
    write_jsonl(folder / "train.jsonl", train)
    write_jsonl(folder / "test.jsonl", test)
    return folder


def make_clustering(root: Path, name: str = "tinyclu") -> Path:
    folder = root / "clustering" / name
    write_jsonl(folder / "test.jsonl", [{"text": f"{TOPICS[i % 4]} item {i}", "label": i % 4} for i in range(12)])
    return folder


def make_pairs(root: Path, name: str = "tinypair") -> Path:
    folder = root / "pair_classification" / name
    rows = [
        {"sentence1": f"{TOPICS[i % 4]} {i}", "sentence2": f"{TOPICS[(i + i % 2) % 4]} b{i}", "label": 1 - i % 2}
        for i in range(10)
    ]
    write_jsonl(folder / "test.jsonl", rows)
    return folder


def loaded(folder: Path):
    task = load_local_task(folder)
    task.load_data()
    return task


def make_self_retrieval(root: Path, name: str) -> Path:
    """A BEIR folder whose queries are also corpus documents (same id, same text), as in ArguAna or Quora: a
    query must not be credited for (or penalised by) retrieving itself."""
    folder = root / "retrieval" / name
    queries = [{"_id": f"a{i}", "text": f"argument about {TOPICS[i % 4]} number {i}"} for i in range(6)]
    others = [{"_id": f"d{i}", "title": "", "text": f"counter to {TOPICS[i % 4]} {i}"} for i in range(6)]
    write_jsonl(folder / "corpus.jsonl", [{**q, "title": ""} for q in queries] + others)
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"a{i}\td{i}\t1\n" for i in range(6)))
    return folder


def make_numbered_collection(root: Path, name: str = "classic") -> Path:
    """A classic test collection (MED / CACM style): queries and documents both numbered 1..N with unrelated texts,
    and query i judged relevant to document i."""
    folder = root / "retrieval" / name
    corpus = [{"_id": str(i), "title": "", "text": f"{TOPICS[i % 4]} report number {i}"} for i in range(1, 13)]
    queries = [{"_id": str(i), "text": f"what is known about {TOPICS[i % 4]}"} for i in range(1, 7)]
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", queries)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"{i}\t{i}\t1\n" for i in range(1, 7)))
    return folder


def rewrite_qrels(folder: Path, pairs: list[tuple[str, str]]) -> None:
    lines = "".join(f"{q}\t{d}\t1\n" for q, d in pairs)
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
