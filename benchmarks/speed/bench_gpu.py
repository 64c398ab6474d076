"""Training-step cost of the contextual model vs the bi-encoder, and faiss k-means on GPU vs CPU (issue 13).

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
import contextlib
import gc
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peak_rss import PeakRSS  # benchmarks/speed/ is the script's folder, first on sys.path

RESULT = "RESULT "  # prefix of the worker's result lines on stdout
MODELS = ("contextual", "biencoder")
ATTENTION = ("sdpa", "flash_attention_2")


# ---------------------------------------------------------------- the encoder
def _tokenizer(folder: str):
    """all-MiniLM-L6-v2's tokenizer, or (not installed, offline) a BERT WordPiece vocabulary of the same size."""
    from transformers import AutoTokenizer, BertTokenizer

    from cde_st.defaults import default_surrogate_model_path

    try:
        return AutoTokenizer.from_pretrained(default_surrogate_model_path())
    except OSError:
        print("all-MiniLM-L6-v2 is not available: using a generated 30,522-token vocabulary", flush=True)
        special = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        words = ["search", "_", "query", "document", ":"]
        tokens = special + words + [f"tok{i}" for i in range(30522 - len(special) - len(words))]
        return BertTokenizer(vocab={token: i for i, token in enumerate(tokens)})


def build_encoder(folder: str, hidden_size: int, layers: int, heads: int, intermediate_size: int) -> str:
    """Save a random-weight BERT of the given size with a BERT tokenizer to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    tokenizer = _tokenizer(folder)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- worker: measurements
def _columns(tokenizer, prompts: list[str], batch: int, length: int, device, seed: int) -> list[dict]:
    """(B, L) features per column: [CLS] prompt random-ids [SEP], no padding (the collator's format)."""
    import torch

    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    low = max(tokenizer.all_special_ids) + 1  # ordinary tokens only
    generator = torch.Generator().manual_seed(seed)
    columns = []
    for prompt in prompts:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        body = length - 2 - len(prompt_ids)
        if body < 1:
            raise ValueError(f"--length {length} leaves no room for text after the prompt {prompt!r}.")
        ids = torch.randint(low, len(tokenizer), (batch, length), generator=generator)
        ids[:, 0], ids[:, -1] = cls_id, sep_id
        ids[:, 1 : 1 + len(prompt_ids)] = torch.tensor(prompt_ids)
        columns.append(
            {
                "input_ids": ids.to(device),
                "attention_mask": torch.ones_like(ids).to(device),
                "token_type_ids": torch.zeros_like(ids).to(device),
            }
        )
    return columns


def _build_model(cfg: dict, spec: dict):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from cde_st import ContextualSentenceTransformer

    if spec["model"] == "contextual":
        return ContextualSentenceTransformer.from_encoder(
            cfg["encoder"],
            context_size=cfg["context_size"],
            max_seq_length=cfg["length"],
            attn_implementation=spec["attn"],
        )
    transformer = Transformer(
        cfg["encoder"], max_seq_length=cfg["length"], model_kwargs={"attn_implementation": spec["attn"]}
    )
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


def measure_step(cfg: dict, spec: dict) -> dict:
    """Step time and peak memory of one configuration (see the module docstring); running out of memory is a
    result too."""
    import torch

    try:
        return {**spec, "status": "ok", **_timed_steps(cfg, spec)}
    except torch.OutOfMemoryError as exc:
        return {**spec, "status": "out of memory", "detail": str(exc).split("\n")[0][:200]}
    finally:  # the model, its gradients and optimizer state went with _timed_steps' frame
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _timed_steps(cfg: dict, spec: dict) -> dict:
    import torch

    from cde_st.losses import FilteredInfoNCELoss

    device = torch.device(cfg["device"])
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = _build_model(cfg, spec).to(device)
    model.train()
    mini = cfg["mini_batch_size"] if spec["cached"] else None
    loss = FilteredInfoNCELoss(model, guide=False, mini_batch_size=mini)
    prompts = [model.prompts.get("query", "search_query: "), model.prompts.get("document", "search_document: ")]
    columns = _columns(model.tokenizer, prompts, cfg["batch_size"], cfg["length"], device, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=spec["bf16"])

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast:  # the backward pass replays both stages (gradient caching): keep it under autocast too
            value = loss([dict(c) for c in columns], None)
            value.backward()
        optimizer.step()
        return value.item()  # waits for the device

    for _ in range(cfg["warmup"]):
        step()
    gc.collect()
    times, values = [], []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    meter = contextlib.nullcontext() if cuda else PeakRSS()
    baseline = 0 if cuda else meter.peak
    with meter:
        for _ in range(cfg["steps"]):
            start = time.perf_counter()
            values.append(step())
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if cuda else meter.peak - baseline
    return {"step_s": statistics.median(times), "peak_mib": peak / 2**20, "loss": values[-1]}


def measure_kmeans(cfg: dict, spec: dict) -> dict:
    """Wall time of cluster_pairs on synthetic unit vectors, faiss on CPU or GPU."""
    import faiss
    import numpy as np

    from cde_st.batching.clustering import cluster_pairs

    rng = np.random.default_rng(0)
    n, dim = cfg["kmeans_pairs"], cfg["kmeans_dim"]
    q = rng.standard_normal((n, dim), dtype=np.float32)
    d = rng.standard_normal((n, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    start = time.perf_counter()
    clustering = cluster_pairs(q, d, cluster_size=cfg["kmeans_cluster_size"], seed=0, use_gpu=spec["use_gpu"])
    seconds = time.perf_counter() - start
    return {
        **spec,
        "status": "ok",
        "seconds": seconds,
        "k": clustering.num_clusters,
        "threads": faiss.omp_get_max_threads(),
    }


def environment(cfg: dict) -> dict:
    import faiss
    import sentence_transformers
    import torch
    import transformers

    device = torch.device(cfg["device"])
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        threads = torch.get_num_threads()
        name = f"{name} ({os.cpu_count()} cores, {threads} torch thread{'s' if threads != 1 else ''})"
    flash = importlib.util.find_spec("flash_attn")
    return {
        "device_name": name,
        "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
        "faiss": f"{faiss.__version__} ({'GPU' if hasattr(faiss, 'StandardGpuResources') else 'CPU-only'} build)",
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "flash_attn": _version("flash_attn") if flash is not None else "not installed",
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        return "installed"


def run_worker(cfg: dict, specs: list[dict]) -> None:
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # the plain encoder's load report (no pooler) on every build
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    print(RESULT + json.dumps({"environment": environment(cfg)}), flush=True)
    for spec in specs:
        result = measure_kmeans(cfg, spec) if spec["kind"] == "kmeans" else measure_step(cfg, spec)
        print(RESULT + json.dumps(result), flush=True)


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
    command = "python benchmarks/speed/bench_gpu.py " + shlex.join(sys.argv[1:])
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
        f"## {args.title or 'Step time, peak memory and k-means on ' + env['device_name']}",
        "",
        f"Command: `{command.strip()}`",
        "",
        f"Device: {env['device_name']}; torch {env['torch']}; faiss {env['faiss']}; transformers "
        f"{env['transformers']}; sentence-transformers {env['sentence_transformers']}; flash-attn {env['flash_attn']}; "
        f"float32 matmul precision {env['matmul_precision']!r}.",
    ]
    if device == "cpu":
        lines[-1] += f" Load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}."
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


def main() -> None:
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
    args = parser.parse_args()
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
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if device == "cpu":
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"  # freed tensors go back to the OS, so RSS follows live memory
    original = args.output.read_text(encoding="utf-8") if args.output and args.output.exists() else ""
    rows, environment_info = [], None
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
        jobs = [[spec] for spec in specs] if args.isolate else [specs]
        for job in jobs:
            process = subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps({"cfg": cfg, "specs": job})],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            done = 0
            for line in process.stdout:
                if not line.startswith(RESULT):
                    continue
                result = json.loads(line[len(RESULT) :])
                if "environment" in result:
                    environment_info = result["environment"]
                    continue
                rows.append(result)
                done += 1
                row = _step_row(result, args) if result["kind"] == "step" else _kmeans_row(result, args)
                print(f"{_label(result)}: {row}", flush=True)
                if args.output:
                    args.output.write_text(
                        original + ("\n" if original else "") + _section(args, environment_info, rows, skipped, device),
                        encoding="utf-8",
                    )
            if process.wait() != 0:
                for spec in job[done:]:
                    skipped.append(f"{_label(spec)}: the worker process failed (exit status {process.returncode})")
                print(f"worker failed (exit status {process.returncode}); see the error above", flush=True)
    if environment_info is None:
        sys.exit("no worker produced results")
    text = _section(args, environment_info, rows, skipped, device)
    if args.output:
        args.output.write_text(original + ("\n" if original else "") + text, encoding="utf-8")
        print(f"wrote {args.output}")
    else:
        print(text)


if __name__ == "__main__":
    main()
