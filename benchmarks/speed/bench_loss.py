"""Benchmark FilteredInfoNCELoss: training-step time and peak memory, plain vs contextual, with and without caching.

    python benchmarks/speed/bench_loss.py                                   # small random BERT, B = 32, 128, 512
    python benchmarks/speed/bench_loss.py --backbone minilm --batch-sizes 32
    python benchmarks/speed/bench_loss.py --guide --batch-sizes 128 --output /tmp/guide.md

Each configuration runs in a fresh subprocess (one warm-up step, then timed steps of forward + backward + AdamW).
Memory is the peak resident set size above the process's RSS after the warm-up step (model, optimizer state,
tokenised batch and allocator caches are then in place), sampled every millisecond by a thread. The worker runs with
a fixed glibc mmap threshold, so large tensors are mmapped and returned to the OS when freed and RSS follows the live
tensors instead of the allocator's high-water mark. Data: real pairs from ../shared/data/pairs (query -> document).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder's modules and the shared benchmarks/harness.py

from harness import command_line, environment  # noqa: E402
from train_step import optimizer_step, time_steps  # noqa: E402

# ---------------------------------------------------------------- configuration
SMALL_BERT = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
SEQ_LEN = 32  # second-stage (and first-stage) token limit
CONTEXT_SIZE = 64  # J for the contextual model
MINI_BATCH = 32  # mini_batch_size = context_mini_batch_size when caching
WARMUP_STEPS, TIMED_STEPS = 1, 3
THREADS = 1  # intra-op threads; the 2-core benchmark machine is shared, so one thread gives stable timings
# benchmarks/speed/ -> the repository -> the shared data folder beside it (../shared)
PAIRS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pairs"
RESULTS = Path(__file__).resolve().parent / "RESULTS_loss.md"


# ---------------------------------------------------------------- worker: one configuration
def _load_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rows = []
    for path in sorted(PAIRS.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    random.Random(seed).shuffle(rows)
    return [r["query"] for r in rows[:n]], [r["document"] for r in rows[:n]]


def run_worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from cde_st import ContextualSentenceTransformer
    from cde_st.losses import FilteredInfoNCELoss

    if spec["contextual"]:
        model = ContextualSentenceTransformer.from_encoder(
            spec["encoder"], context_size=CONTEXT_SIZE, max_seq_length=SEQ_LEN
        )
    else:
        transformer = Transformer(spec["encoder"], max_seq_length=SEQ_LEN)
        model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
    model.train()
    mini = MINI_BATCH if spec["cached"] else None
    loss = FilteredInfoNCELoss(model, guide=None if spec["guide"] else False, mini_batch_size=mini)
    queries, docs = _load_pairs(spec["batch_size"])
    columns = [model.preprocess(queries, prompt="search_query: "), model.preprocess(docs, prompt="search_document: ")]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    measured = time_steps(optimizer_step(loss, optimizer, columns), WARMUP_STEPS, TIMED_STEPS, "cpu")
    return {**{k: v for k, v in spec.items() if k != "encoder"}, **measured}


# ---------------------------------------------------------------- driver
def _small_bert(folder: str) -> str:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from cde_st.defaults import default_surrogate_model_path

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default_surrogate_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **SMALL_BERT)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _machine() -> str:
    env = environment("cpu", ())
    return (
        f"{env['device']}; {env['cpu_count']} cores; torch {env['torch']} (CPU), {THREADS} intra-op thread; "
        f"load average at the end {env['load_average']} (machine shared with other jobs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", choices=["small", "minilm"], default="small")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--models", nargs="+", choices=["plain", "contextual"], default=["plain", "contextual"])
    parser.add_argument("--guide", action="store_true", help="filter with the default guide (off: isolate caching)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return
    if not PAIRS.is_dir():
        sys.exit(f"shared data not found at {PAIRS}")

    from cde_st.defaults import default_surrogate_model_path

    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MALLOC_MMAP_THRESHOLD_="131072", HF_HUB_OFFLINE="1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        encoder = default_surrogate_model_path() if args.backbone == "minilm" else _small_bert(tmp)
        for batch_size in args.batch_sizes:
            for kind in args.models:
                for cached in (False, True):
                    spec = dict(
                        backbone=args.backbone,
                        contextual=kind == "contextual",
                        batch_size=batch_size,
                        cached=cached,
                        guide=args.guide,
                        encoder=encoder,
                    )
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", json.dumps(spec)],
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    if out.returncode != 0:
                        sys.exit(f"worker failed for {spec}:\n{out.stderr[-3000:]}")
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    rows.append(row)
                    print(_format_row(row), flush=True)
    _write(args, rows)


def _format_row(r: dict) -> str:
    cache = f"mini_batch_size={MINI_BATCH}" if r["cached"] else "no caching"
    model = "contextual" if r["contextual"] else "plain"
    return (
        f"| {r['backbone']} | {model} | {r['batch_size']} | {cache} | {'on' if r['guide'] else 'off'} | "
        f"{r['step_s']:.2f} | {r['peak_mib']:.0f} | {r['loss']:.3f} |"
    )


def _write(args: argparse.Namespace, rows: list[dict]) -> None:
    command = command_line()
    backbone = (
        f"random BERT {SMALL_BERT} with MiniLM's tokenizer"
        if args.backbone == "small"
        else "all-MiniLM-L6-v2 (offline copy)"
    )
    lines = [
        f"## FilteredInfoNCELoss: step time and peak memory ({args.backbone} backbone)",
        "",
        f"Command: `{command.strip()}`",
        "",
        f"Machine: {_machine()}.",
        "",
        f"Setup: backbone {backbone}; max length {SEQ_LEN}; contextual J = {CONTEXT_SIZE} (the batch's documents, "
        f"sampled when B > J); caching = mini_batch_size = context_mini_batch_size = {MINI_BATCH}; "
        f"(query, document) pairs from ../shared/data/pairs; one step = forward + backward + AdamW; "
        f"median of {TIMED_STEPS} steps after {WARMUP_STEPS} warm-up step(s), each configuration in a fresh process.",
        "",
        "Peak memory = max RSS during the timed steps minus RSS after the warm-up step (sampled every 1 ms; "
        "glibc mmap threshold fixed at 128 KiB so freed tensors leave the RSS). It is the transient memory of a "
        "step: activations, gradients of the embeddings and the graph; weights, optimizer state and the batch are "
        "in the baseline.",
        "",
        "| backbone | model | batch | caching | guide | step (s) | peak extra memory (MiB) | loss |",
        "|---|---|---:|---|---|---:|---:|---:|",
        *(_format_row(r) for r in rows),
        "",
    ]
    text = "\n".join(lines)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if args.output.exists() and args.output.read_text(encoding="utf-8").strip() else "w"
    with open(args.output, mode, encoding="utf-8") as f:
        f.write(("\n" if mode == "a" else "# FilteredInfoNCELoss benchmark\n\n") + text)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
