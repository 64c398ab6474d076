"""Encoding throughput: plain all-MiniLM-L6-v2 bi-encoder vs contextual models (context already set).

    python benchmarks/speed/bench_encode.py [--docs 1000] [--queries 300] [--batch-size 32] [--max-seq-length 256]
        [--sizes 64 512] [--modes joint cached]

Encodes the first N SciFact documents and the first M SciFact queries (short texts; ../shared/data) with each
model (taking turns on slices of them, so that other load on the machine falls on all models alike) and prints
docs/s, queries/s and the ratios to the bi-encoder. ``--modes``: the contextual models' ``context_attention``
("joint": the paper, context rows re-encoded with every text; "cached": context keys/values computed once per
context; "cached+gate": the same with the context gate, whose context read is a separate softmax; "+top3": only
the top 3 layers read the context, ``context_layers=[-3, -2, -1]``). Also prints the memory of each cached
context. Results are recorded in benchmarks/speed/RESULTS_encode.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import environment, timed_calls, warm_up  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

from cde_st import ContextualSentenceTransformer  # noqa: E402
from cde_st.data import document_text  # noqa: E402
from cde_st.defaults import default_surrogate_model_path  # noqa: E402

# benchmarks/speed/ -> the repository -> the shared data folder beside it (../shared)
SCIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrieval" / "scifact"


def scifact_docs() -> list[str]:
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        return [document_text(r.get("title"), r["text"]) for r in map(json.loads, f)]


def scifact_queries() -> list[str]:
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        return [r["text"] for r in map(json.loads, f)]


def interleaved_rates(models: dict, docs: list[str], batch_size: int, rounds: int) -> dict[str, float]:
    """docs/s of each model on the same documents. The models take turns on each of ``rounds`` slices, so load
    from other processes on this shared machine falls on all of them alike and the ratios stay meaningful."""
    for model in models.values():
        warm_up(lambda model=model: model.encode(docs[: 2 * batch_size], batch_size=batch_size))
    seconds = dict.fromkeys(models, 0.0)
    step = -(-len(docs) // rounds)
    for start in range(0, len(docs), step):
        chunk = docs[start : start + step]
        for name, model in models.items():
            (taken,), _ = timed_calls(lambda model=model, chunk=chunk: model.encode(chunk, batch_size=batch_size))
            seconds[name] += taken
    return {name: len(docs) / s for name, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    modes = ["joint", "cached", "cached+gate", "cached+top3", "cached+gate+top3"]
    parser.add_argument("--modes", nargs="+", default=modes[:3], choices=modes)
    parser.add_argument("--rounds", type=int, default=4, help="slices the models take turns on")
    args = parser.parse_args()

    corpus = scifact_docs()
    docs, queries = corpus[: args.docs], scifact_queries()[: args.queries]
    path = default_surrogate_model_path()
    env = environment("cpu", ())
    print(
        f"machine: {env['device']}, {env['cpu_count']} cores, torch {env['torch']}, threads {env['torch_threads']}, "
        f"load {env['load_average']}; {len(docs)} SciFact docs, {len(queries)} SciFact queries "
        f"(mean {sum(map(len, queries)) / len(queries):.0f} characters), batch {args.batch_size}, "
        f"max_seq_length {args.max_seq_length}"
    )

    models = {"all-MiniLM-L6-v2 bi-encoder": SentenceTransformer(path)}
    for size in args.sizes:
        for mode in args.modes:
            attention, *options = mode.split("+")
            top = [int(o[3:]) for o in options if o.startswith("top")]
            model = ContextualSentenceTransformer.from_encoder(
                path,
                context_size=size,
                prompts={},
                context_attention=attention,
                context_gate="gate" in options,
                context_layers=list(range(-top[0], 0)) if top else None,
            )
            model.eval()
            model.set_context(corpus, seed=0)  # context already set: only the second stage is timed
            models[f"contextual {mode}, J = {size}"] = model
    for model in models.values():
        model.max_seq_length = args.max_seq_length
    doc_rates = interleaved_rates(models, docs, args.batch_size, args.rounds)
    query_rates = interleaved_rates(models, queries, args.batch_size, args.rounds)
    base = "all-MiniLM-L6-v2 bi-encoder"
    print("| model | docs/s | ratio | queries/s | ratio | cached context |\n|---|---|---|---|---|---|")
    for name, model in models.items():
        cache = ""
        if isinstance(model, ContextualSentenceTransformer):
            cache_bytes = model.contextual_module.context_cache_bytes()
            cache = f"{cache_bytes / 2**20:.1f} MiB" if cache_bytes else "-"
        print(
            f"| {name} | {doc_rates[name]:.1f} | {doc_rates[name] / doc_rates[base]:.2f} | "
            f"{query_rates[name]:.1f} | {query_rates[name] / query_rates[base]:.2f} | {cache} |"
        )


if __name__ == "__main__":
    main()
