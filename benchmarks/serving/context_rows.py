"""The named-context rows of ``bench_serving.py --scenario contexts``:

- **many contexts**: 32 single-query clients, each request naming one context: always the same one, or ``--contexts``
  (100) in turn (request k names context k mod 100), on two replicas of one state directory: one keeps the
  keys/values of every context (``--context-cache-mb 4096``), the other none (``--context-cache-mb 0``: recomputed
  at every switch, as before the cache). Texts/s, latency and the server's mean batch.
- **creation**: ``--creation-clients`` single-query clients while a context is created from a
  ``--creation-docs`` (10,000) document corpus (SciFact's documents, then LISA's and CACM's), against the same load
  for as long without a creation: p50/p99 latency, and how long the creation took.

Each context of the first row is sampled (``size`` ``--context-docs``, seeds 1..N) from SciFact's documents: fewer
documents than J make the same J slots (null-padded), so the keys/values cost what a full context's do. Rounds
take turns (``--rounds``) so the load of a shared machine falls on all rows alike.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import httpx
import numpy as np
from harness import Stopwatch, command_line, load_average, write_json  # benchmarks/: on the path bench_serving.py sets

from cde_st.data import document_text

RETRIEVAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "retrieval"


def corpus(n: int) -> list[str]:
    """``n`` distinct documents: SciFact's, then LISA's and CACM's."""
    documents: dict[str, None] = {}
    for name in ("scifact", "lisa", "cacm", "med"):
        with gzip.open(RETRIEVAL / name / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
            for row in map(json.loads, f):
                documents[document_text(row.get("title"), row["text"])] = None
                if len(documents) >= n:
                    return list(documents)
    raise SystemExit(f"only {len(documents)} documents in {RETRIEVAL}; asked for {n}")


def _body(text: str, context: str) -> dict:
    return {"model": "m", "input": [text], "context": context, "input_type": "query", "encoding_format": "base64"}


async def rotating_load(url: str, texts: list[str], contexts: list[str], clients: int, seconds: float, until=None):
    """``clients`` single-text clients; request k names ``contexts[k % len]``. Runs ``seconds``, or while
    ``until`` (an asyncio task) is not done. Returns (texts done, elapsed s, latencies s)."""
    latencies: list[float] = []
    counter = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        elapsed = Stopwatch()

        def going() -> bool:
            return not until.done() if until is not None else elapsed.seconds < seconds

        async def worker() -> None:
            nonlocal counter
            while going():
                k, counter = counter, counter + 1
                with Stopwatch() as request:
                    response = await client.post(
                        "/v1/embeddings", json=_body(texts[k % len(texts)], contexts[k % len(contexts)])
                    )
                latencies.append(request.seconds)
                response.raise_for_status()

        with elapsed:
            await asyncio.gather(*(worker() for _ in range(clients)))
        return len(latencies), elapsed.seconds, latencies


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def create_contexts(url: str, docs: list[str], n: int, size: int) -> list[str]:
    """Contexts ctx-001 .. ctx-N (those already in the state directory of an earlier run are kept)."""
    names = []
    with httpx.Client(base_url=url, timeout=600) as client:
        stored = {c["name"] for c in client.get("/v1/contexts").json()["data"] if c["size"] == size}
        for seed in range(1, n + 1):
            name = f"ctx-{seed:03d}"
            if name in stored:
                names.append(name)
                continue
            body = {"name": name, "documents": docs, "size": size, "seed": seed, "replace": True}
            client.post("/v1/contexts", json=body).raise_for_status()
            names.append(name)
    return names


def many_contexts(servers: dict, queries: list[str], names: list[str], args) -> list[dict]:
    """The one-vs-many rows: for each server (budget) and each context set, texts/s and latency."""
    sets = {"1 context": names[:1], f"{len(names)} contexts in turn": names}
    totals = {(budget, label): {"texts": 0, "seconds": 0.0, "latencies": [], "forwards": 0.0}
              for budget in servers for label in sets}  # fmt: skip
    for server in servers.values():  # warm: every context's keys/values made once where they are kept
        asyncio.run(_warm(server.url, names))
    for round_ in range(args.rounds):
        order = list(totals) if round_ % 2 == 0 else list(totals)[::-1]
        for budget, label in order:
            url = servers[budget].url
            forwards = _metric(url, "cde_st_batch_size_texts_count")
            done, elapsed, latencies = asyncio.run(
                rotating_load(url, queries, sets[label], args.clients_many, args.seconds / args.rounds)
            )
            total = totals[(budget, label)]
            total["texts"] += done
            total["seconds"] += elapsed
            total["latencies"] += latencies
            total["forwards"] += _metric(url, "cde_st_batch_size_texts_count") - forwards
        print(f"many contexts: round {round_ + 1}/{args.rounds}, load average {load_average()}", flush=True)
    rows = []
    for (budget, label), total in totals.items():
        p50, p99 = (float(np.percentile(total["latencies"], q) * 1000) for q in (50, 99))
        rows.append({"row": "many contexts", "budget_mb": budget, "contexts": label, "texts": total["texts"],
                     "texts_per_s": total["texts"] / total["seconds"], "p50_ms": p50, "p99_ms": p99,
                     "texts_per_forward": total["texts"] / max(1.0, total["forwards"]),
                     "kept_contexts": _metric(servers[budget].url, "cde_st_context_cache_contexts"),
                     "kept_bytes": _metric(servers[budget].url, "cde_st_context_cache_bytes")})  # fmt: skip
    return rows


async def _warm(url: str, names: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for name in names:
            (await client.post("/v1/embeddings", json=_body("warm-up", name))).raise_for_status()


async def _with_creation(url: str, queries: list[str], docs: list[str], seed: int, args):
    body = {"name": "big", "documents": docs, "seed": seed, "replace": True, "size": args.creation_size}
    # Serialised before the clock starts and sent from a thread, so the creation's 10 MB body does not stall
    # this process's event loop (the clients' own latency) while it is encoded.
    content = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    watch = Stopwatch()
    creation = asyncio.ensure_future(
        asyncio.to_thread(httpx.post, url + "/v1/contexts", content=content, headers=headers, timeout=1200)
    )
    await asyncio.sleep(0)
    done, elapsed, latencies = await rotating_load(url, queries, ["ctx-001"], args.creation_clients, 0, creation)
    (await creation).raise_for_status()
    return latencies, watch.seconds


def creation(server, queries: list[str], args) -> list[dict]:
    """Latency of single-query clients with and without a large context being created meanwhile."""
    docs = corpus(args.creation_docs)
    latencies = {"without a creation": [], f"while a {len(docs)}-document context is created": []}
    made = []
    for round_ in range(args.rounds):
        during, seconds = asyncio.run(_with_creation(server.url, queries, docs, round_, args))
        latencies[list(latencies)[1]] += during
        made.append(seconds)
        base = asyncio.run(rotating_load(server.url, queries, ["ctx-001"], args.creation_clients, seconds))[2]
        latencies["without a creation"] += base
        print(f"creation: round {round_ + 1}/{args.rounds} ({seconds:.0f} s), load average "
              f"{load_average()}", flush=True)  # fmt: skip
    rows = []
    for label, values in latencies.items():
        p50, p99 = (float(np.percentile(values, q) * 1000) for q in (50, 99))
        rows.append({"row": "creation", "load": label, "requests": len(values), "p50_ms": p50, "p99_ms": p99,
                     "creation_s": float(np.mean(made))})  # fmt: skip
    return rows


def print_rows(rows: list[dict]) -> None:
    if any(r["row"] == "many contexts" for r in rows):
        print("| budget | contexts | texts | texts/s | p50 ms | p99 ms | texts/forward | kept contexts | kept MB |")
        print("|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in rows if r["row"] == "many contexts"):
        print(f"| {r['budget_mb']} MiB | {r['contexts']} | {r['texts']} | {r['texts_per_s']:.1f} | {r['p50_ms']:.0f} | "
              f"{r['p99_ms']:.0f} | {r['texts_per_forward']:.1f} | {r['kept_contexts']:.0f} | "
              f"{r['kept_bytes'] / 2**20:.1f} |")  # fmt: skip
    if any(r["row"] == "creation" for r in rows):
        print("\n| load | requests | p50 ms | p99 ms | creation s |")
        print("|---|---|---|---|---|")
    for r in (r for r in rows if r["row"] == "creation"):
        print(f"| {r['load']} | {r['requests']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['creation_s']:.1f} |")


def add_arguments(p) -> None:
    """bench_serving.py's options for these rows."""
    p.add_argument("--scenario", choices=["encode", "contexts"], default="encode",
                   help="contexts: the named-context rows of context_rows.py instead")  # fmt: skip
    p.add_argument("--contexts", type=int, default=100, help="contexts: how many are requested in turn")
    p.add_argument("--context-docs", type=int, default=8, help="contexts: documents sampled per context")
    p.add_argument("--clients-many", type=int, default=32, help="contexts: clients of the many-contexts row")
    p.add_argument("--creation-clients", type=int, default=8, help="contexts: clients during a creation")
    p.add_argument("--creation-docs", type=int, default=10000, help="contexts: documents sent to the creation")
    p.add_argument("--creation-size", type=int, default=None, help="contexts: documents sampled (default: J)")
    p.add_argument("--rows", nargs="+", choices=["many", "creation"], default=["many", "creation"])


def run(folder: Path, work: Path, server_class, queries: list[str], args) -> None:
    """Start the two replicas, make the contexts, measure both rows; print them and write them as JSON."""
    state = work / "context-state"
    common = ["--state-dir", str(state), "--context-refresh-s", "0.2"]
    servers = {}
    try:
        for budget in (4096, 0):
            flags = [*common, "--context-cache-mb", str(budget)]
            servers[budget] = server_class(folder, work / f"server-cache{budget}.log", args.max_batch_size,
                                           args.max_wait_ms, extra=flags)  # fmt: skip
        watch = Stopwatch()
        names = create_contexts(servers[4096].url, corpus(200), args.contexts, args.context_docs)
        print(f"made {len(names)} contexts in {watch.seconds:.0f} s", flush=True)
        time.sleep(1)  # the other replica sees them within its refresh interval
        rows = []
        if "many" in args.rows:
            rows += many_contexts(servers, queries, names, args)
            print_rows(rows)
        if "creation" in args.rows:
            rows += creation(servers[4096], queries, args)
            print_rows([r for r in rows if r["row"] == "creation"])
    finally:
        for server in servers.values():
            server.stop()
    print(f"load average at the end {load_average()}")
    out = work / f"results-contexts-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_json(out, {"command": command_line(), "args": vars(args), "results": rows})
    print(f"wrote {out}")
