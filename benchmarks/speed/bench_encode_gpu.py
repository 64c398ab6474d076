"""Encode throughput on a device: today's ``encode``, cde_st's ``encode_fast`` and the limit, in one command.

    python benchmarks/speed/bench_encode_gpu.py --out "$OUT"                 # CUDA, MiniLM, the issue's sizes
    python benchmarks/speed/bench_encode_gpu.py --smoke --out /tmp/enc      # tiny random model on the CPU (seconds)

For each model (all-MiniLM-L6-v2 as a bi-encoder, and as cde_st's cached contextual model, the mini recipe, with J
context documents set), dtype (bf16 autocast over float32 weights, float32) and batch (rows), documents/s and
queries/s of:

- ``today``: ``model.encode_document`` / ``encode_query`` with the default numpy output (sentence-transformers:
  per-batch tokenisation, copy, forward and ``.cpu()``);
- ``new``: ``cde_st.encode_fast(model, texts, kind, batch_size=batch)``, numpy output too (tokenised ahead,
  length-sorted, one copy back);
- ``new_budget``: ``encode_fast`` with ``batch_tokens = batch x 256`` and rows unbounded (short texts in larger
  batches);
- ``limit``: the model's forward alone over the same length-sorted batches of ``batch`` rows, tokenised and copied to
  the device before the clock starts;
- ``tokenise``: the host's ``model.preprocess`` of every text (4,096 a call), no device work.

Each rate is the best of ``--repeats`` timed calls after a warm-up call; ``max_abs_new_vs_today`` compares the two
paths' embeddings. Texts are random words of the tokenizer's vocabulary (one token each; documents about 200 tokens,
queries about 16), made by ``random_models.make_texts``. Rows run in order (bf16 first) until ``--budget-s`` is
spent; what is left is recorded as skipped. Output: ``bench_encode_gpu.json`` (rewritten after every row) and
``bench_encode_gpu.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from random_models import bi_encoder, build_bert_folder, load_tokenizer, make_texts, mini_contextual  # noqa: E402

from cde_st import encode_fast, is_contextual  # noqa: E402
from cde_st.model import contextual_module  # noqa: E402

FULL = dict(docs=4096, queries=4096, doc_words=200, query_words=16, context_size=512, batches=[128, 512])
SMOKE = dict(docs=16, queries=16, doc_words=40, query_words=6, context_size=8, batches=[8, 32])
TINY_SHAPE = dict(hidden_size=32, layers=6, heads=2, intermediate_size=64)  # six layers: the mini recipe reads 3-5
METHODS = ("today", "new", "new_budget", "limit")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(run, device: torch.device, repeats: int) -> tuple[float, object]:
    """The shortest of ``repeats`` timed calls of ``run`` after one warm-up call, and the last call's result."""
    run()
    sync(device)
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times), result


def weights_check(model):
    return contextual_module(model).one_weights_check() if is_contextual(model) else contextlib.nullcontext()


def device_batches(model, texts: list[str], role: str, batch: int, device: torch.device) -> list[dict]:
    """The limit's input: length-sorted batches of ``batch`` rows, tokenised by the model, already on the device."""
    prompt = model.prompts.get(role)
    lengths = model.preprocess(texts, prompt=prompt, task=role)["attention_mask"].sum(dim=1).numpy()
    order = np.argsort(-lengths, kind="stable")
    batches = []
    for start in range(0, len(texts), batch):
        features = model.preprocess([texts[i] for i in order[start : start + batch]], prompt=prompt, task=role)
        batches.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()})
    sync(device)
    return batches


def rates(model, texts: list[str], role: str, batch: int, args, device: torch.device) -> dict:
    """Texts per second of every method for one (model, dtype, batch, role), and the paths' agreement."""
    kind = "query" if role == "query" else "document"
    today = model.encode_query if role == "query" else model.encode_document
    calls = {  # the default output, numpy, as a user gets it (today's path copies each batch back)
        "today": lambda: today(texts, batch_size=batch),
        "new": lambda: encode_fast(model, texts, kind, batch_size=batch),
        "new_budget": lambda: encode_fast(model, texts, kind, batch_size=len(texts), batch_tokens=batch * 256),
    }
    batches = device_batches(model, texts, role, batch, device)

    def limit():
        with weights_check(model):
            for features in batches:
                out = model(dict(features), task=kind)["sentence_embedding"]
        return out

    calls["limit"] = limit
    row, outputs = {}, {}
    for method, run in calls.items():
        seconds, outputs[method] = best_time(run, device, args.repeats)
        row[f"{method}_per_s"] = len(texts) / seconds
    row["new_over_limit"] = row["new_per_s"] / row["limit_per_s"]
    row["today_over_limit"] = row["today_per_s"] / row["limit_per_s"]
    row["max_abs_new_vs_today"] = float(np.abs(outputs["new"] - outputs["today"]).max())
    return row


def tokenise_rate(model, texts: list[str], role: str) -> float:
    prompt = model.prompts.get(role)
    start = time.perf_counter()
    for i in range(0, len(texts), 4096):
        model.preprocess(texts[i : i + 4096], prompt=prompt, task=role)
    return len(texts) / (time.perf_counter() - start)


def profile_encode(model, texts: list[str], batch: int, device: torch.device, out: Path) -> dict:
    """torch.profiler over one document call of each path (bf16 autocast on CUDA): the top operators by host time
    to ``profile_<path>.txt``, and the device's busy share (its kernels' summed time over the wall time)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    calls = {
        "today": lambda: model.encode_document(texts, batch_size=batch),
        "new": lambda: encode_fast(model, texts, "document", batch_size=batch),
    }
    result = {}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for name, run in calls.items():
            run()
            sync(device)
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                run()
                sync(device)
                wall = time.perf_counter() - start
            events = prof.key_averages()
            busy = sum(e.self_device_time_total for e in events) / 1e6
            (out / f"profile_{name}.txt").write_text(events.table(sort_by="self_cpu_time_total", row_limit=30))
            result[name] = {"wall_s": wall, "texts_per_s": len(texts) / wall, "device_busy_share": busy / wall}
    return result


def build_models(args, sizes: dict, device: torch.device):
    """(name, builder) of the two models, and the tokenizer the texts are made from."""
    if args.smoke:
        tokenizer, _ = load_tokenizer(None, smoke=True)
        folder = build_bert_folder(Path(args.out) / "tiny_bert", tokenizer, TINY_SHAPE)
    else:
        folder = args.model or str(load_tokenizer(None, smoke=False)[1])
        if not Path(folder).is_dir():
            sys.exit(f"No all-MiniLM-L6-v2 folder (got {folder!r}): pass --model FOLDER.")
        tokenizer, _ = load_tokenizer(folder, smoke=False)
    j, base = sizes["context_size"], "tiny random BERT" if args.smoke else "MiniLM"
    models = [
        (f"{base} bi-encoder", lambda: bi_encoder(folder, 512)),
        (f"{base} cached contextual (mini recipe), J = {j}", lambda: mini_contextual(folder, j)),
    ]
    return models, tokenizer, folder


def environment(device: torch.device) -> dict:
    import sentence_transformers
    import transformers

    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "python": platform.python_version(),
        "load_average_start": os.getloadavg(),
    }


def markdown(report: dict) -> str:
    lines = [
        f"Device: {report['environment']['device']}; sizes {report['sizes']}; load average at the end "
        f"{report['environment'].get('load_average_end')}.",
        "",
        "| model | dtype | batch | texts | today /s | new /s | new, token budget /s | limit /s | new / limit "
        "| today / limit | tokenise only /s | max abs new vs today |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['role']} | {r['status']} |||||||| ")
            continue
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['role']} | {r['today_per_s']:,.0f} "
            f"| {r['new_per_s']:,.0f} | {r['new_budget_per_s']:,.0f} | {r['limit_per_s']:,.0f} "
            f"| {r['new_over_limit']:.2f} | {r['today_over_limit']:.2f} | {r['tokenise_per_s']:,.0f} "
            f"| {r['max_abs_new_vs_today']:.1e} |"
        )
    if "profile" in report:
        lines.append(f"\nProfile of one document call ({report['profile']['model']}): {report['profile']}")
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> None:
    (out / "bench_encode_gpu.json").write_text(json.dumps(report, indent=1, default=float), encoding="utf-8")
    (out / "bench_encode_gpu.md").write_text(markdown(report), encoding="utf-8")


def row_labels(name: str, args, sizes: dict) -> list[dict]:
    """The rows of one model, in the order they are measured."""
    return [
        {"model": name, "dtype": dtype, "batch": batch, "role": role}
        for dtype in args.dtypes
        for batch in sizes["batches"]
        for role in ("document", "query")
    ]


def measure_model(name, build, texts, context, args, sizes, device, report, deadline) -> None:
    if time.monotonic() > deadline:  # no row of this model would start: it is not built
        report["rows"] += [{**label, "status": "skipped: --budget-s spent"} for label in row_labels(name, args, sizes)]
        return
    model = build().float().to(device).eval()
    if is_contextual(model):
        with torch.inference_mode():
            model.set_context(context, seed=0)
    tokenise = {role: tokenise_rate(model, texts[role], role) for role in texts}
    if args.profile and "profile" not in report:  # the first model only
        batch = sizes["batches"][0]
        report["profile"] = {"model": name, **profile_encode(model, texts["document"], batch, device, Path(args.out))}
        print(json.dumps({"profile": report["profile"]}, default=float), flush=True)
    for label in row_labels(name, args, sizes):
        if time.monotonic() > deadline:
            report["rows"].append({**label, "status": "skipped: --budget-s spent"})
            continue
        start = time.monotonic()
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=label["dtype"] == "bf16")
        role = label["role"]
        try:
            with autocast:
                row = rates(model, texts[role], role, label["batch"], args, device)
            row = {**label, "status": "ok", **row, "tokenise_per_s": tokenise[role]}
        except torch.OutOfMemoryError as exc:
            row = {**label, "status": "out of memory", "detail": str(exc)[:200]}
        row["seconds"] = round(time.monotonic() - start, 2)
        report["rows"].append(row)
        print(json.dumps(row, default=float), flush=True)
        write(report, Path(args.out))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON and Markdown")
    parser.add_argument("--smoke", action="store_true", help="tiny random model and sizes (runs on the CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", help="MiniLM folder (default: the offline package, else .gpu/minilm)")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--batches", nargs="+", type=int, help="batch rows (default 128 512; smoke 8 32)")
    parser.add_argument("--docs", type=int, help="documents per timed call")
    parser.add_argument("--queries", type=int, help="queries per timed call")
    parser.add_argument("--context-size", type=int, help="J of the contextual model (default 512)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per method (the best counts)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--profile", action="store_true", help="profile one document call per path (first model)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no new row starts after this many seconds")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = dict(SMOKE if args.smoke else FULL)
    for key in ("batches", "docs", "queries", "context_size"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    device, out = torch.device(args.device), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    models, tokenizer, folder = build_models(args, sizes, device)
    texts = {
        "document": make_texts(tokenizer, sizes["docs"], sizes["doc_words"], seed=4),
        "query": make_texts(tokenizer, sizes["queries"], sizes["query_words"], seed=5),
    }
    context = make_texts(tokenizer, sizes["context_size"], sizes["doc_words"], seed=6)
    report = {"environment": environment(device), "sizes": sizes, "model_folder": folder, "rows": []}
    report["command"] = " ".join(sys.argv)
    for name, build in models:
        measure_model(name, build, texts, context, args, sizes, device, report, deadline)
    report["environment"]["load_average_end"] = os.getloadavg()
    write(report, out)
    print(markdown(report))


if __name__ == "__main__":
    main()
