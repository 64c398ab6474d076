"""Latency of one small encode call (one query, or a handful) on a contextual model with its context set.

    python benchmarks/speed/bench_encode_latency.py [--batch 1 32] [--calls 20]

Throughput (benchmarks/speed/bench_encode.py) hides costs paid once per ``encode`` call, such as the check that the
active context and cached keys/values still match the weights. This times ``encode_query`` calls of
``--batch`` copies of one short query on the MiniLM-built cached + gate + top-3 model (J = 64 SciFact documents)
and prints the median over ``--calls`` calls, after three warm-up calls. Results: benchmarks/speed/RESULTS_encode.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
from pathlib import Path

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import load_average, timed_calls, warm_up  # noqa: E402

from cde_st import ContextualSentenceTransformer  # noqa: E402
from cde_st.defaults import default_surrogate_model_path  # noqa: E402

# benchmarks/speed/ -> the repository -> the shared data folder beside it (../shared)
SCIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrieval" / "scifact"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="queries per encode call")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f][:500]
    model = ContextualSentenceTransformer.from_encoder(
        default_surrogate_model_path(),
        context_size=64,
        context_attention="cached",
        context_gate=True,
        context_layers=[-3, -2, -1],
        first_stage_head="none",
        output_head="none",
    )
    model.set_context(docs, seed=0)
    query = "what causes rain in the tropics?"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, J = 64, cached+gate+top3 MiniLM")
    for batch in args.batch:
        texts = [query] * batch
        warm_up(lambda texts=texts: model.encode_query(texts), 3)
        times, _ = timed_calls(lambda texts=texts: model.encode_query(texts), args.calls)
        print(f"{batch} queries per call: median {1000 * statistics.median(times):.1f} ms (load {load_average()})")


if __name__ == "__main__":
    main()
