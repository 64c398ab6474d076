"""Training-step cost of the contextual model vs the bi-encoder, and faiss k-means on GPU vs CPU.

    python benchmarks/speed/bench_gpu.py --output benchmarks/speed/RESULTS_gpu.md           # the issue's sizes, on CUDA if any
    python benchmarks/speed/bench_gpu.py --device cpu --threads 1 --hidden-size 128 --layers 2 --heads 2 \\
        --batch-size 16 --context-size 16 --length 64 --mini-batch-size 8 --kmeans-pairs 20000   # CPU smoke run
    python benchmarks/speed/bench_gpu.py --models --kmeans cpu gpu     # k-means rows only (--kmeans alone: none)

Step rows: one optimizer step (FilteredInfoNCELoss forward + backward + AdamW) of (a) a ContextualSentenceTransformer
built with ``from_encoder`` and (b) the plain bi-encoder (Transformer + mean Pooling) on the same encoder, for every
combination of
    gradient caching   off, or mini_batch_size = context_mini_batch_size = --mini-batch-size
    attention          "sdpa" and "flash_attention_2" (skipped, with the reason printed, without CUDA or flash-attn)
    bf16 autocast      on (around forward *and* backward: the loss replays both stages in its backward hook) or off
Batch = cluster = B (query, document) rows, every row exactly L tokens: [CLS] + the query/document prompt's tokens
+ random token ids + [SEP], built directly in the collator's format (no data, no tokenising). The contextual model's
context is the batch's documents (J = min(B, context size); the rest null slots), as in training. No false-negative
guide (``guide=False``): the guide's cost is the same for both models and is left out. Step time: median of
--steps timed steps after --warmup steps. Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over the timed
steps (weights, optimizer state and batch included); on CPU the peak RSS above the RSS after warm-up (sampled every
millisecond; glibc's mmap threshold is fixed so that freed tensors leave the RSS), i.e. the step's transient memory.
A step that runs out of memory is recorded as such.

k-means rows: ``cde_st.batching.clustering.cluster_pairs`` (the clustered sampler's k-means: [q;d] and [d;q] points,
spherical, subsampled to 256 points per centroid, 20 iterations, assignment of every pair) on --kmeans-pairs
synthetic random unit vectors (--kmeans-dim wide) with clusters of --kmeans-cluster-size, with ``use_gpu=False`` and
``use_gpu=True`` (skipped, with the reason, when faiss has no GPU build or sees no GPU).

The encoder is a random-weight BERT built from the size flags (default: BERT-base, 768 wide, 12 layers), saved with
all-MiniLM-L6-v2's tokenizer (a generated vocabulary of the same size when that offline model is not installed), or
any encoder folder with --encoder. All configurations run in one worker process (--isolate: one process each).
Results go to stdout and, with --output, to a section appended to that Markdown file (rewritten after every row, so
an interrupted run keeps what it measured).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder's modules and the shared benchmarks/harness.py

from harness import command_line, emit_result, environment, load_average, parse_result  # noqa: E402

MODELS = ("contextual", "biencoder")
ATTENTION = ("sdpa", "flash_attention_2")


def build_encoder(folder: str, hidden_size: int, layers: int, heads: int, intermediate_size: int) -> str:
    """Save a random-weight BERT of the given size with all-MiniLM-L6-v2's tokenizer (or a generated one of the
    same size where that model is not installed) to ``folder``."""
    from random_models import build_bert_folder, load_tokenizer

    tokenizer, source = load_tokenizer(None)
    print(f"tokenizer: {source}", flush=True)
    shape = dict(hidden_size=hidden_size, layers=layers, heads=heads, intermediate_size=intermediate_size)
    return build_bert_folder(Path(folder), tokenizer, shape)


def run_worker(cfg: dict, specs: list[dict]) -> None:
    import torch
    from train_step import measure_kmeans, measure_step
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # the plain encoder's load report (no pooler) on every build
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    env = environment(cfg["device"], ("transformers", "sentence-transformers", "flash-attn"))
    if importlib.util.find_spec("faiss") is not None:
        import faiss

        env["faiss"] = f"{faiss.__version__} ({'GPU' if hasattr(faiss, 'StandardGpuResources') else 'CPU-only'} build)"
    emit_result({"environment": env})
    for spec in specs:
        emit_result(measure_kmeans(cfg, spec) if spec["kind"] == "kmeans" else measure_step(cfg, spec))


# ---------------------------------------------------------------- driver
def _skip_reasons(args: argparse.Namespace, device: str) -> tuple[list[dict], list[str]]:
    """The configurations to run, and one line per skipped configuration saying why."""
    specs, skipped = [], []
    flash_missing = []
    if device != "cuda":
        flash_missing.append(f"the device is {device} (flash-attention runs on CUDA only)")
    if importlib.util.find_spec("flash_attn") is None:
        flash_missing.append("flash-attn is not installed (pip install 'cde_st[flash]')")
    # k-means first: short, and independent of the step rows (which may run out of memory or time)
    for where in args.kmeans:
        spec = dict(kind="kmeans", use_gpu=where == "gpu")
        if spec["use_gpu"]:
            reason = _faiss_gpu_missing(device)
            if reason:
                skipped.append(f"k-means on GPU: skipped, {reason}")
                continue
        specs.append(spec)
    no_flash, no_fp32 = 0, 0
    for model in args.models:
        for cached in args.caching:
            for attn in args.attention:
                for bf16 in args.bf16:
                    spec = dict(kind="step", model=model, cached=cached == "on", attn=attn, bf16=bf16 == "on")
                    if attn == "flash_attention_2" and flash_missing:
                        no_flash += 1
                    elif attn == "flash_attention_2" and not spec["bf16"]:
                        no_fp32 += 1
                    else:
                        specs.append(spec)
    if no_flash:
        skipped.append(f"flash_attention_2 ({no_flash} configurations): skipped, {' and '.join(flash_missing)}")
    if no_fp32:
        skipped.append(f"flash_attention_2 with bf16 off ({no_fp32} configurations): skipped, no float32 kernels")
    return specs, skipped


def _faiss_gpu_missing(device: str) -> str | None:
    """Why faiss cannot run on the GPU here (the clustering code's own check), or None."""
    from cde_st.batching.clustering import faiss_use_gpu

    if device != "cuda":
        return f"the device is {device}"
    try:
        faiss_use_gpu(True)
    except ValueError as exc:
        return str(exc)
    return None


def _label(spec: dict) -> str:
    if spec["kind"] == "kmeans":
        return f"k-means on {'GPU' if spec['use_gpu'] else 'CPU'}"
    cache = "cached" if spec["cached"] else "uncached"
    return f"{spec['model']}, {cache}, {spec['attn']}, bf16 {'on' if spec['bf16'] else 'off'}"


def _step_row(r: dict, args: argparse.Namespace) -> str:
    cache = f"mini_batch_size={args.mini_batch_size}" if r["cached"] else "off"
    head = f"| {r['model']} | {cache} | {r['attn']} | {'on' if r['bf16'] else 'off'} |"
    if r["status"] != "ok":
        return f"{head} {r['status']} | {r['status']} | |"
    return f"{head} {r['step_s']:.3f} | {r['peak_mib']:.0f} | {r['loss']:.3f} |"


def _kmeans_row(r: dict, args: argparse.Namespace) -> str:
    where = "GPU" if r["use_gpu"] else f"CPU ({r['threads']} thread{'s' if r['threads'] != 1 else ''})"
    return f"| {where} | {args.kmeans_pairs:,} | {args.kmeans_dim} | {r['k']} | {r['seconds']:.2f} |"


def _section(args: argparse.Namespace, env: dict, rows: list[dict], skipped: list[str], device: str) -> str:
    command = command_line()
    encoder = args.encoder or (
        f"random-weight BERT (hidden {args.hidden_size}, {args.layers} layers, {args.heads} heads, "
        f"intermediate {args.intermediate_size or 4 * args.hidden_size})"
    )
    memory = (
        "torch.cuda.max_memory_allocated over the timed steps (weights, optimizer state and batch included)"
        if device == "cuda"
        else "peak RSS above the RSS after warm-up (the step's transient memory; weights and optimizer state excluded)"
    )
    steps = [r for r in rows if r["kind"] == "step"]
    kmeans = [r for r in rows if r["kind"] == "kmeans"]
    lines = [
        f"## {args.title or 'Step time, peak memory and k-means on ' + env['device']}",
        "",
        f"Command: `{command.strip()}`",
        "",
        "Environment: "
        + "; ".join(f"{k} {v}" for k, v in env.items())
        + f"; load average at the end {load_average()}.",
    ]
    if steps or any(s.startswith("flash") for s in skipped):
        lines += [
            "",
            f"Step: {encoder}; batch = cluster = B = {args.batch_size} (query, document) rows of exactly "
            f"L = {args.length} tokens (random ids after the prompt); contextual J = {args.context_size} slots, "
            f"filled with the batch's documents; FilteredInfoNCELoss(guide=False); one step = forward + backward + "
            f"AdamW, bf16 autocast around forward and backward; median of {args.steps} steps after {args.warmup} "
            f"warm-up. Peak memory: {memory}.",
            "",
            "| model | gradient caching | attention | bf16 | step (s) | peak memory (MiB) | loss |",
            "|---|---|---|---|---:|---:|---:|",
            *(_step_row(r, args) for r in steps),
        ]
    if kmeans:
        lines += [
            "",
            f"k-means: cde_st.batching.clustering.cluster_pairs, cluster size {args.kmeans_cluster_size}, synthetic "
            "random unit vectors (q and d), default niter 20 and 256 points per centroid; wall time of the call "
            "(training and assigning every pair).",
            "",
            "| faiss | pairs | dim | k | time (s) |",
            "|---|---:|---:|---:|---:|",
            *(_kmeans_row(r, args) for r in kmeans),
        ]
    if skipped:
        lines += ["", "Skipped:", "", *(f"- {line}" for line in skipped)]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    parser.add_argument("--encoder", help="an encoder folder instead of the random BERT built from the size flags")
    parser.add_argument("--hidden-size", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate-size", type=int, default=None, help="default: 4 x hidden size")
    parser.add_argument("--batch-size", type=int, default=512, help="B = cluster size (rows per step)")
    parser.add_argument("--context-size", type=int, default=512, help="J, the contextual model's context slots")
    parser.add_argument("--length", type=int, default=512, help="L, tokens per row (and per context document)")
    parser.add_argument("--mini-batch-size", type=int, default=64, help="gradient-caching chunk (both stages)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS), help="none: no step rows")
    parser.add_argument("--caching", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--attention", nargs="+", choices=ATTENTION, default=list(ATTENTION))
    parser.add_argument("--bf16", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--kmeans", nargs="*", choices=["cpu", "gpu"], default=["cpu", "gpu"], help="none: skip")
    parser.add_argument("--kmeans-pairs", type=int, default=1_000_000)
    parser.add_argument("--kmeans-dim", type=int, default=384)
    parser.add_argument("--kmeans-cluster-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--isolate", action="store_true", help="one worker process per configuration")
    parser.add_argument("--title", help="heading of the results section")
    parser.add_argument("--output", type=Path, help="append the results section to this Markdown file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args()


def run_jobs(args: argparse.Namespace, cfg: dict, specs: list[dict], skipped: list[str], write) -> tuple[list, dict]:
    """Run ``specs`` in worker processes (one, or one each with ``--isolate``); ``write(rows, env)`` after every row.
    A worker that fails leaves its remaining configurations in ``skipped``, with its exit status."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if cfg["device"] == "cpu":
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"  # freed tensors go back to the OS, so RSS follows live memory
    rows, environment_info = [], None
    for job in [[spec] for spec in specs] if args.isolate else [specs]:
        process = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps({"cfg": cfg, "specs": job})],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        done = 0
        for line in process.stdout:
            result = parse_result(line)
            if result is None:
                continue
            if "environment" in result:
                environment_info = result["environment"]
                continue
            rows.append(result)
            done += 1
            row = _step_row(result, args) if result["kind"] == "step" else _kmeans_row(result, args)
            print(f"{_label(result)}: {row}", flush=True)
            write(rows, environment_info)
        if process.wait() != 0:
            for spec in job[done:]:
                skipped.append(f"{_label(spec)}: the worker process failed (exit status {process.returncode})")
            print(f"worker failed (exit status {process.returncode}); see the error above", flush=True)
    return rows, environment_info


def main() -> None:
    args = parse_args()
    if args.worker:
        job = json.loads(args.worker)
        run_worker(job["cfg"], job["specs"])
        return

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False).")
    specs, skipped = _skip_reasons(args, device)
    for line in skipped:
        print(line, flush=True)
    original = args.output.read_text(encoding="utf-8") if args.output and args.output.exists() else ""

    def write(rows: list[dict], env: dict) -> None:  # rewritten after every row: a stopped run keeps its rows
        if args.output:
            text = _section(args, env, rows, skipped, device)
            args.output.write_text(original + ("\n" if original else "") + text, encoding="utf-8")

    with tempfile.TemporaryDirectory() as tmp:
        encoder = args.encoder
        if encoder is None and any(s["kind"] == "step" for s in specs):
            intermediate = args.intermediate_size or 4 * args.hidden_size
            encoder = build_encoder(tmp, args.hidden_size, args.layers, args.heads, intermediate)
        cfg = dict(
            device=device,
            encoder=encoder,
            batch_size=args.batch_size,
            context_size=args.context_size,
            length=args.length,
            mini_batch_size=args.mini_batch_size,
            warmup=args.warmup,
            steps=args.steps,
            kmeans_pairs=args.kmeans_pairs,
            kmeans_dim=args.kmeans_dim,
            kmeans_cluster_size=args.kmeans_cluster_size,
            threads=args.threads,
        )
        rows, environment_info = run_jobs(args, cfg, specs, skipped, write)
    if environment_info is None:
        sys.exit("no worker produced results")
    write(rows, environment_info)
    if args.output:
        print(f"wrote {args.output}")
    else:
        print(_section(args, environment_info, rows, skipped, device))


if __name__ == "__main__":
    main()
