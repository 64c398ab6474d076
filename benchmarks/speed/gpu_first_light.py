"""First light on a GPU: correctness and cost of cde_st in one command that stops itself inside its time budget.

    python benchmarks/speed/gpu_first_light.py --out "$OUT"            # the real sizes, on CUDA (about 5 minutes)
    python benchmarks/speed/gpu_first_light.py --smoke --out /tmp/fl    # every section at tiny sizes on the CPU (seconds)

Sections, each with its own time budget (``--budget SECTION=SECONDS``); a row that would not fit in what is left of its
section is skipped and says so, and a section still running at its budget + 20 s is stopped (its worker process is
killed, the rows it finished are kept, the next sections run in a new worker). Nothing is estimated: every number
in the output was measured in this run.

- ``agreement``: the same random-weight model's embeddings on CPU float32 vs the device in float32 (max abs diff),
  bf16 autocast vs float32 on the device (cosine per text), and, for the mini architecture, the cached context
  against a fresh computation and a zero gate against no context (paths that must give the same numbers); for
  the ``mini`` architecture (all-MiniLM-L6-v2's shape, the mini preset's contextual recipe, gates set to 0.5 so the
  context is read) and the released cde-small-v2 architecture at real size (ModernBERT-base, cde_st's released
  mode, random weights).
- ``encode``: documents/s and queries/s at batch 128 and 512 (bf16 autocast): the MiniLM-shaped bi-encoder, the
  contextual model with the cached context (mini recipe) and with the paper's joint attention, both J = 512, and
  the v2 architecture (J = 512) against a plain ModernBERT-base bi-encoder.
- ``step``: one training step (FilteredInfoNCELoss without guide + AdamW, bf16 autocast) of the contextual model
  (mini recipe) and of its bi-encoder on the MiniLM-shaped encoder, batch = J = 512, length 128 and 512, with and
  without two-stage gradient caching: median step time and peak memory (``train_step.measure_step``).
- ``sdpa``: which scaled-dot-product-attention kernel each attention path runs by default (the aten op the profiler
  records) and which kernels it can run when forced (``torch.nn.attention.sdpa_kernel``), in bf16 autocast.
- ``kmeans``: the clustered sampler's spherical k-means of 1M x 384 pairs (k = pairs / 1024, 256 training points
  per centroid, 20 iterations, every pair assigned): written in torch on the device, and ``cluster_pairs`` itself
  (faiss, on the GPU when faiss is a GPU build that sees one, else the CPU) when faiss imports; rows name which.
- ``surrogate``: the clustered sampler's MiniLM surrogate (``embed_pairs``, length 64) in pairs per second in
  float32, with TF32 matmuls, in float16 and bfloat16 weights (with the lowest cosine to float32), against the
  host's tokenisation alone.

The sections live in ``first_light_sections.py`` and the random models and texts in ``random_models.py``, beside
this driver, which runs them in worker processes under their budgets and writes the report.

Texts are words of the tokenizer's vocabulary (one token each), documents about 200 tokens and queries about 16. The
tokenizer is all-MiniLM-L6-v2's (``--tokenizer``, default: the offline package or the folder ``.gpu/minilm``), or a
generated vocabulary of the same size when neither is there (``--smoke`` always uses that one).

Output: ``first_light.json`` (every row, the environment, the sizes, the time of each section) and
``first_light.md`` (the same as tables) in ``--out`` (default ``$OUT``), and a short summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder's modules and the shared benchmarks/harness.py

from harness import (  # noqa: E402
    command_line,
    emit_result,
    environment,
    format_value,
    markdown_table,
    parse_result,
    write_json,
)
from random_models import MODERNBERT_BASE  # noqa: E402

SECTIONS = ("agreement", "encode", "step", "sdpa", "kmeans", "surrogate")
# Seconds per section at the real sizes: 290 in all, so that with start-up the run ends near 6 minutes.
BUDGETS = {"agreement": 60, "encode": 60, "step": 70, "sdpa": 35, "kmeans": 25, "surrogate": 40}
SMOKE_BUDGETS = {"agreement": 60, "encode": 60, "step": 60, "sdpa": 60, "kmeans": 60, "surrogate": 60}
GRACE_S = 20  # past its budget a section's worker is killed: the soft checks inside failed to stop it

# Every size as (the real run, --smoke): the smoke run goes through every section at sizes a CPU runs in seconds.
SIZES = {
    "bert": (  # the real run: all-MiniLM-L6-v2's shape
        dict(hidden_size=384, layers=6, heads=12, intermediate_size=1536),
        dict(hidden_size=32, layers=6, heads=2, intermediate_size=64),
    ),
    "modernbert": (
        MODERNBERT_BASE,
        {
            **MODERNBERT_BASE,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "local_attention": 16,
        },
    ),  # fmt: skip
    "context_size": (512, 8),
    "agreement_docs": (32, 6),  # the CPU float32 pass of the real-size v2 bounds these
    "agreement_queries": (16, 4),
    "agreement_context": (32, 4),
    "doc_words": (200, 24),
    "query_words": (16, 6),
    "encode_batches": ([128, 512], [4, 8]),
    "encode_batches_per_row": (4, 2),
    "step_batch": (512, 8),
    "step_lengths": ([128, 512], [16]),
    "step_mini_batch": (64, 4),
    "step_warmup": (1, 0),
    "step_steps": (2, 1),
    "kmeans_pairs": (1_000_000, 3000),
    "kmeans_dim": (384, 16),
    "kmeans_cluster_size": (1024, 100),
    "surrogate_pairs": (8192, 64),
    "surrogate_batch": (1024, 16),
}
FULL = {name: sizes[0] for name, sizes in SIZES.items()}
SMOKE = {name: sizes[1] for name, sizes in SIZES.items()}


# ================================================================ worker
def run_worker(job: dict) -> None:
    """The worker process: build the random encoders once, then run the job's sections in order, each with its
    deadline; every row and each section's end is a result line on stdout."""
    import torch
    from first_light_sections import SECTION_FUNCS, Section
    from random_models import build_bert_folder, load_tokenizer, modernbert_folder
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    tokenizer, tokenizer_source = load_tokenizer(job["tokenizer"], job["smoke"])
    work = Path(job["work"])
    sizes = job["sizes"]
    ctx = {
        "sizes": sizes,
        "device": job["device"],
        "tokenizer": tokenizer,
        "bert_folder": build_bert_folder(work / "bert", tokenizer, sizes["bert"]),
    }
    emit_result({"environment": environment(job["device"]), "tokenizer": tokenizer_source})
    for name, deadline_in in job["sections"]:
        sec = Section(name, time.monotonic() + deadline_in)
        start = time.monotonic()
        if name in ("encode", "sdpa", "agreement") and "modernbert_folder" not in ctx:
            ctx["modernbert_folder"] = modernbert_folder(work / "modernbert", tokenizer, sizes["modernbert"])
        SECTION_FUNCS[name](sec, ctx)
        emit_result({"section": name, "done": round(time.monotonic() - start, 1)})


# ================================================================ driver
def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _runnable(pending: list[str], budgets: dict, left: float, report: dict) -> list[str]:
    """The pending sections whose budgets fit in ``left`` seconds, in order; the others are recorded as skipped."""
    runnable = []
    for name in pending:
        if budgets[name] > left:
            report["sections"][name] = {
                "status": f"skipped: its budget ({budgets[name]} s) exceeds the {left:.0f} s left"
            }
        else:
            runnable.append(name)
            left -= budgets[name]
    return runnable


def run_sections(args, sizes: dict, budgets: dict, work: Path, report) -> None:
    """Run the sections in worker processes; a section past its budget + GRACE_S kills its worker (its finished
    rows are kept) and the rest go on in a new one."""
    pending = list(args.sections)
    started = time.monotonic()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    env["PYTHONUNBUFFERED"] = "1"
    while pending:
        pending = _runnable(pending, budgets, args.total_s - (time.monotonic() - started), report)
        if not pending:
            return
        job = dict(
            device=args.device,
            sizes=sizes,
            smoke=args.smoke,
            tokenizer=args.tokenizer,
            threads=args.threads,
            work=str(work),
            sections=[[name, budgets[name]] for name in pending],
        )
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        if not _follow_worker(process, pending, budgets, args, report):
            return
        process.wait()


def _follow_worker(process, pending: list[str], budgets: dict, args, report: dict) -> bool:
    """Record the worker's result lines into ``report`` (removing each finished section from ``pending``) until it
    ends or its current section passes its deadline (then it is killed). False: it died during start-up."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
    current, deadline = None, time.monotonic() + 120  # start-up: imports and the random encoders
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            line = "TIMEOUT"
        if line == "TIMEOUT" or (line is None and pending):
            if line == "TIMEOUT":
                process.kill()
            why = "stopped at its time budget" if line == "TIMEOUT" else f"the worker exited ({process.wait()})"
            print(f"{current or 'start-up'}: {why}", flush=True)
            if current is None:
                for name in pending:
                    report["sections"][name] = {"status": f"not run: {why} during start-up"}
                return False
            report["sections"][current] = {"status": why + "; the rows above were measured before"}
            pending.remove(current)
            return True
        message = None if line is None else parse_result(line)
        if line is None:
            return True
        if message is None:
            continue
        if "environment" in message:
            report["environment"], report["tokenizer"] = message["environment"], message["tokenizer"]
        elif "row" in message:
            report["rows"].setdefault(message["section"], []).append(message["row"])
            print(f"[{message['section']}] {json.dumps(message['row'], default=float)}", flush=True)
        elif "done" in message:
            report["sections"][message["section"]] = {"status": "done", "seconds": message["done"]}
            pending.remove(message["section"])
        if ("environment" in message or "done" in message) and pending:
            current = pending[0]
            deadline = time.monotonic() + budgets[current] + GRACE_S
        write_outputs(args, report)


def markdown(report: dict) -> str:
    env = report.get("environment", {})
    lines = [
        "# cde_st first light" + (" (smoke run: tiny sizes, numbers mean nothing)" if report["smoke"] else ""),
        "",
        f"Command: `{report['command']}`",
        "",
        "Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()) + f"; tokenizer: {report.get('tokenizer')}.",
        "",
        "Sections: "
        + "; ".join(
            f"{k}: {v['status']}" + (f" ({v['seconds']} s)" if "seconds" in v else "")
            for k, v in report["sections"].items()
        )
        + ".",
    ]
    for name, rows in report["rows"].items():
        columns = list(dict.fromkeys(k for row in rows for k in row if k != "detail"))
        lines += ["", f"## {name}", "", *markdown_table(columns, [[row.get(c, "") for c in columns] for row in rows])]
        details = [
            f"- {row.get('model') or row.get('architecture') or row.get('path')}: {row['detail']}"
            for row in rows
            if row.get("detail")
        ]
        lines += ["", *details] if details else []
    return "\n".join(lines) + "\n"


def write_outputs(args, report: dict) -> None:
    write_json(args.out / "first_light.json", report)
    (args.out / "first_light.md").write_text(markdown(report), encoding="utf-8")


def summary(report: dict) -> str:
    out = [f"device: {report.get('environment', {}).get('device')}"]
    for row in report["rows"].get("agreement", []):
        if row.get("status") == "ok" and "device_fp32_vs_cpu_fp32_max_abs" in row:
            out.append(
                f"agreement {row['architecture']}: fp32 device vs CPU max abs {row['device_fp32_vs_cpu_fp32_max_abs']:.2e}, "
                f"bf16 min cosine {row['bf16_vs_fp32_min_cosine']:.5f}"
            )
    encode = {(r["model"], r["batch"]): r for r in report["rows"].get("encode", []) if r.get("status") == "ok"}
    for (model, batch), row in encode.items():
        base = encode.get(("MiniLM-shaped bi-encoder", batch))
        ratio = (
            f" ({row['docs_per_s'] / base['docs_per_s']:.2f}x the MiniLM bi-encoder)"
            if base and "MiniLM" not in model and "ModernBERT" not in model
            else ""
        )
        out.append(
            f"encode {model}, batch {batch}: {row['docs_per_s']:.0f} docs/s{ratio}, {row['queries_per_s']:.0f} queries/s"
        )
    for row in report["rows"].get("step", []):
        if row.get("status") == "ok":
            out.append(
                f"step {row['model']} L={row['length']} caching {row['gradient_caching']}: {row['step_s']:.3f} s, {row['peak_mib']:.0f} MiB"
            )
    for row in report["rows"].get("sdpa", []):
        if row.get("status") == "ok":
            out.append(f"sdpa {row['path']}: default {format_value(row['default'])}")
    for row in report["rows"].get("kmeans", []):
        if row.get("status") == "ok":
            out.append(f"k-means {row['implementation']} on {row['where']}: {row['kmeans_s']:.1f} s, k={row['k']}")
    for row in report["rows"].get("surrogate", []):
        if row.get("status") == "ok":
            cosine = f", min cosine to fp32 {row['min_cosine_to_fp32']:.5f}" if "min_cosine_to_fp32" in row else ""
            out.append(f"surrogate {row['surrogate']}: {row['pairs_per_s']:.0f} pairs/s{cosine}")
    skipped = [f"{s}: {r.get('status')}" for s, rows in report["rows"].items() for r in rows if r.get("status") != "ok"]
    skipped += [f"{s}: {v['status']}" for s, v in report["sections"].items() if v["status"] != "done"]
    return "\n".join(out + [f"not ok: {line}" for line in skipped])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="output folder (default: $OUT)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, every section, in seconds")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--budget", nargs="*", default=[], metavar="SECTION=SECONDS", help="a section's time budget")
    parser.add_argument("--total-s", type=float, default=None, help="all sections together (default: the budgets' sum)")
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: all-MiniLM-L6-v2's, see above)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(json.loads(args.worker))
        return
    if args.out is None:
        parser.error("--out is required when $OUT is not set")
    if args.smoke:
        args.device = args.device or "cpu"
    if args.device != "cpu":  # the driver imports torch only to find the device: the worker does the work
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("--device cuda, but torch sees no CUDA device.")
    budgets = dict(SMOKE_BUDGETS if args.smoke else BUDGETS)
    for item in args.budget:
        name, _, seconds = item.partition("=")
        if name not in budgets:
            parser.error(f"--budget {item}: unknown section {name!r}; choose from {list(budgets)}")
        budgets[name] = float(seconds)
    if args.total_s is None:
        args.total_s = sum(budgets[s] for s in args.sections) + 60
    report = {
        "command": command_line(),
        "smoke": args.smoke,
        "sizes": SMOKE if args.smoke else FULL,
        "budgets_s": budgets,
        "sections": {},
        "rows": {},
    }
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        run_sections(args, report["sizes"], budgets, Path(work), report)
    report["wall_s"] = round(time.monotonic() - start, 1)
    write_outputs(args, report)
    print(summary(report))
    print(f"wrote {args.out / 'first_light.json'} and {args.out / 'first_light.md'} ({report['wall_s']} s)")


if __name__ == "__main__":
    main()
