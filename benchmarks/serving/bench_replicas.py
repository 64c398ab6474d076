"""Replicas of ``cde-st-serve``: two workers against one, a bounded soak of mixed traffic, and a replica killed
inside a context write.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/serving/bench_replicas.py SECTION [--seconds S]
        [--work-dir DIR]

Sections (the model: ``bench_serving.py``'s contextual MiniLM, J = 512, SciFact context saved as "default", built
once in ``--work-dir``; one torch thread per process):

- ``replicas``: 32 single-query clients against ``--workers 1`` and ``--workers 2`` (one port, one state directory),
  in alternating rounds of ``--seconds`` / ``--rounds`` each: texts/s, p50/p99 latency, and their ratio.
- ``soak``: ``--workers 2`` for ``--seconds`` (600): 16 clients embed queries and documents (1 to 8 texts) in the
  default context or one of three stored ones, while one client creates a context, embeds with it and deletes it,
  over and over. Every answer's status is counted (an error is any answer other than 2xx, except 429 and 503 that
  carry Retry-After); the resident memory of the parent and of each worker is sampled every 10 s, and its slope
  over the run after its first minute is given in MiB per minute.
- ``kill9``: two servers on their own ports share a state directory; a context is replaced through one of them,
  which is killed (SIGKILL) at a growing delay inside the write, then started again. After each trial both must
  serve the context with the old or the new fingerprint, the same one, with the same vectors; a bystander context
  must be untouched. Outcomes counted, restart time given.
- ``spread``: 4 keep-alive clients against ``--workers 2`` with ``--max-requests-per-connection`` 1000 and 10, in
  ``--rounds`` alternating rounds: the CPU seconds each worker used, so where the connections landed.

Writes ``results-SECTION-*.json`` in ``--work-dir`` and prints a Markdown table. Results: RESULTS_serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_serving  # noqa: E402
import harness  # noqa: E402
from context_rows import corpus  # noqa: E402

ALLOWED_REFUSALS = (429, 503)  # with Retry-After: the server says "later", not "wrong"


def _server(folder: Path, work: Path, name: str, *flags: str) -> bench_serving.Server:
    return bench_serving.Server(folder, work / f"server-{name}.log", 32, 5.0, extra=flags)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    """``pid``'s child processes (each listed under the thread that started it)."""
    return [int(p) for task in Path(f"/proc/{pid}/task").iterdir() for p in (task / "children").read_text().split()]


def _tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (a worker's model process; pages they share count twice)."""
    return _rss_mib(pid) + sum(_tree_rss_mib(child) for child in _children(pid))


def replicas(folder: Path, work: Path, queries: list[str], args) -> list[dict]:
    totals = {n: {"texts": 0, "seconds": 0.0, "latencies": []} for n in (1, 2)}
    servers = {}
    try:
        for n in (1, 2):
            servers[n] = _server(
                folder, work, f"workers{n}", "--state-dir", str(work / f"state-w{n}"), "--workers", str(n)
            )
        body = {"model": "m", "input_type": "query", "encoding_format": "base64"}
        for round_ in range(args.rounds):
            for n in (1, 2) if round_ % 2 == 0 else (2, 1):
                done, elapsed, latencies = asyncio.run(
                    bench_serving.load(servers[n].url, body, queries, 32, 1, args.seconds / args.rounds, 10**9)
                )
                totals[n]["texts"] += done
                totals[n]["seconds"] += elapsed
                totals[n]["latencies"] += latencies
            harness.log(f"round {round_ + 1}/{args.rounds}, load average {harness.load_average()}")
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    for n, total in totals.items():
        rate = total["texts"] / total["seconds"]
        p50, p99 = np.percentile(total["latencies"], [50, 99]) * 1000
        rows.append({"workers": n, "texts/s": round(rate, 1), "p50 ms": round(p50), "p99 ms": round(p99)})
    for row in rows:
        row["vs one worker"] = round(row["texts/s"] / rows[0]["texts/s"], 2)
    return rows


async def _mixed_traffic(url: str, queries, documents, contexts, seconds: float, statuses: Counter, latencies):
    limits = httpx.Limits(max_connections=17, max_keepalive_connections=17)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        stop = time.monotonic() + seconds

        async def ask(route: str, method: str, path: str, **kwargs) -> httpx.Response:
            t0 = time.monotonic()
            response = await client.request(method, path, **kwargs)
            latencies.append(time.monotonic() - t0)
            refused = response.status_code in ALLOWED_REFUSALS and "retry-after" in response.headers
            statuses[(route, response.status_code, "refusal" if refused else "")] += 1
            return response

        async def embedder(seed: int) -> None:
            rng = random.Random(seed)  # the same traffic in every run
            while time.monotonic() < stop:
                kind, texts = rng.choice((("query", queries), ("document", documents)))
                batch = rng.sample(texts, rng.randint(1, 8))
                body = {
                    "model": "m",
                    "input": batch,
                    "input_type": kind,
                    "context": rng.choice(contexts),
                    "truncate": True,
                }
                await ask("embed", "POST", "/v1/embeddings", json=body)

        async def churner() -> None:
            docs, k = corpus(64), 0
            while time.monotonic() < stop:
                name, k = f"churn-{k:05d}", k + 1
                body = {"name": name, "documents": docs, "size": 32, "seed": k}
                if (await ask("create", "POST", "/v1/contexts", json=body)).status_code == 201:
                    await ask(
                        "embed-new", "POST", "/v1/embeddings", json={"model": "m", "input": ["q"], "context": name}
                    )
                    await ask("delete", "DELETE", f"/v1/contexts/{name}")

        await asyncio.gather(*(embedder(i) for i in range(16)), churner())


def _sample_memory(pid: int, samples: list, stop: threading.Event) -> None:
    started = time.monotonic()
    while not stop.wait(10):
        try:
            workers = {child: _tree_rss_mib(child) for child in _children(pid)}
            below = {child: sum(_tree_rss_mib(g) for g in _children(child)) for child in workers}  # model processes
        except (FileNotFoundError, ProcessLookupError):
            continue
        samples.append({"s": round(time.monotonic() - started, 1), "parent": _rss_mib(pid), "workers": workers,
                        "workers' children": below})  # fmt: skip


def soak(folder: Path, work: Path, queries: list[str], args) -> list[dict]:
    state = work / "state-soak"
    flags = ["--state-dir", str(state), "--workers", "2", "--context-refresh-s", "0.2"] + args.server_flags
    server = _server(folder, work, "soak", *flags)
    samples, statuses, latencies, stop = [], Counter(), [], threading.Event()
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            for i in range(1, 4):
                body = {"name": f"keep-{i}", "documents": corpus(128), "size": 64, "seed": i, "replace": True}
                client.post("/v1/contexts", json=body).raise_for_status()
        time.sleep(1)  # the other worker sees them within its refresh interval
        sampler = threading.Thread(target=_sample_memory, args=(server.proc.pid, samples, stop), daemon=True)
        sampler.start()
        documents = bench_serving.scifact("documents")[:2000]
        contexts = ["default", "keep-1", "keep-2", "keep-3"]
        t0 = time.monotonic()
        asyncio.run(_mixed_traffic(server.url, queries, documents, contexts, args.seconds, statuses, latencies))
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        server.stop()
    after_warm_up = [s for s in samples if s["s"] >= 60] or samples
    minutes = np.array([s["s"] / 60 for s in after_warm_up])
    total = np.array([s["parent"] + sum(s["workers"].values()) for s in after_warm_up])
    slope = float(np.polyfit(minutes, total, 1)[0]) if len(minutes) > 1 else float("nan")
    errors = {f"{route} {code}": n for (route, code, refusal), n in statuses.items() if code >= 300 and not refusal}
    return [{
        "seconds": round(elapsed), "answers": sum(statuses.values()),
        "by route and status": {f"{route} {code}{' (Retry-After)' if r else ''}": n for (route, code, r), n in statuses.items()},
        "errors": errors, "p50 ms": round(float(np.percentile(latencies, 50)) * 1000),
        "p99 ms": round(float(np.percentile(latencies, 99)) * 1000),
        "RSS first/last MiB": [round(float(total[0])), round(float(total[-1]))],
        "RSS slope MiB/min": round(slope, 2), "memory samples": samples,
    }]  # fmt: skip


def _served(url: str, name: str) -> tuple[str, np.ndarray]:
    with httpx.Client(base_url=url, timeout=120) as client:
        fingerprint = client.get(f"/v1/contexts/{name}").json()["fingerprint"]
        body = {"model": "m", "input": ["a query about cells", "another one"], "input_type": "query", "context": name}
        answer = client.post("/v1/embeddings", json=body).json()
    return fingerprint, np.array([row["embedding"] for row in answer["data"]])


def _check_outcome(b_url: str, body: dict, served: tuple, before: tuple, answer: dict) -> str:
    """Whether the served context is the one before the trial or the replacement (made again through the other
    replica under another name: the same fingerprint and vectors), by its fingerprint and its vectors."""
    if served[0] == before[0]:
        return "old" if np.array_equal(served[1], before[1]) else "MIX (old fingerprint, other vectors)"
    with httpx.Client(base_url=b_url, timeout=600) as client:
        client.post("/v1/contexts", json=body | {"name": "check", "replace": True}).raise_for_status()
    again = _served(b_url, "check")
    if again[0] != served[0] or not np.array_equal(again[1], served[1]):
        return "MIX (neither the old nor the new context)"
    return "new" if answer.get("fingerprint") == served[0] else "new (written, the answer cut)"


def kill9(folder: Path, work: Path, queries: list[str], args) -> list[dict]:
    state = work / "state-kill9"
    flags = ("--state-dir", str(state), "--context-refresh-s", "0.2")
    docs = corpus(600)
    a, b = _server(folder, work, "kill9-a", *flags), _server(folder, work, "kill9-b", *flags)
    rows = []
    try:
        with httpx.Client(base_url=a.url, timeout=600) as client:
            t0 = time.monotonic()
            for name, seed in (("subject", 0), ("bystander", 1)):
                body = {"name": name, "documents": docs[:64], "size": 32, "seed": seed, "replace": True}
                client.post("/v1/contexts", json=body).raise_for_status()
            creation = (time.monotonic() - t0) / 2
        time.sleep(1)
        bystander, before = _served(b.url, "bystander"), _served(b.url, "subject")
        for trial in range(args.trials):
            delay = creation * (0.3 + 1.7 * trial / max(1, args.trials - 1))  # before, inside and after the write
            body = {"name": "subject", "documents": docs[trial : trial + 64], "size": 32, "seed": 100 + trial,
                    "replace": True}  # fmt: skip
            answer: dict = {}
            writer = threading.Thread(target=_post_quietly, args=(a.url, body, answer), daemon=True)
            writer.start()
            time.sleep(delay)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait()
            writer.join(timeout=60)
            t0 = time.monotonic()
            a = _server(folder, work, f"kill9-a{trial}", *flags)
            restart = time.monotonic() - t0
            time.sleep(1)
            served_a, served_b = _served(a.url, "subject"), _served(b.url, "subject")
            rows.append({
                "trial": trial, "kill after s": round(delay, 2), "write answered": answer.get("status", "no answer"),
                "outcome": _check_outcome(b.url, body, served_a, before, answer),
                "replicas agree": served_a[0] == served_b[0] and bool(np.array_equal(served_a[1], served_b[1])),
                "bystander intact": _same(_served(a.url, "bystander"), bystander),
                "restart s": round(restart, 1),
            })  # fmt: skip
            harness.log(str(rows[-1]))
            before = served_a
    finally:
        a.stop()
        b.stop()
    return rows


def _same(x: tuple, y: tuple) -> bool:
    return x[0] == y[0] and bool(np.array_equal(x[1], y[1]))


def _post_quietly(url: str, body: dict, answer: dict) -> None:
    """Create a context; its answer's status and fingerprint in ``answer``, or the transport error (the replica
    killed before it answered)."""
    try:
        response = httpx.post(f"{url}/v1/contexts", json=body, timeout=120)
    except httpx.TransportError as exc:
        answer["status"] = type(exc).__name__
        return
    answer.update(status=response.status_code, fingerprint=response.json().get("fingerprint"))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(folder: Path, work: Path, queries: list[str], args) -> list[dict]:
    """4 keep-alive clients send 60 single queries each to ``--workers 2``, with ``--max-requests-per-connection``
    1000 (the default: no connection ends within the run) and 10, in alternating rounds; how the workers' CPU time
    splits shows where the connections landed."""
    rows = []
    for round_ in range(args.rounds):
        for cap in ("1000", "10") if round_ % 2 == 0 else ("10", "1000"):
            state = work / f"state-spread-{round_}-{cap}"
            server = _server(folder, work, f"spread{cap}", "--state-dir", str(state), "--workers", "2",
                             "--max-requests-per-connection", cap)  # fmt: skip
            try:
                deadline = time.monotonic() + 300
                while len(_children(server.proc.pid)) < 2 or any(  # both workers loaded and idle
                    not Path(f"/proc/{child}").exists() for child in _children(server.proc.pid)
                ):
                    assert time.monotonic() < deadline, "the workers did not start"
                    time.sleep(1)
                time.sleep(10)
                workers = _children(server.proc.pid)
                before = {pid: _cpu_seconds(pid) for pid in workers}
                asyncio.run(_keep_alive_load(server.url, queries, clients=4, requests=60))
                used = sorted((_cpu_seconds(pid) - before[pid] for pid in workers), reverse=True)
            finally:
                server.stop()
            rows.append({"requests per connection": int(cap), "round": round_, "busier worker CPU s": round(used[0], 2),
                         "other worker CPU s": round(used[1], 2), "busier share": round(used[0] / sum(used), 2)})  # fmt: skip
    return rows


async def _keep_alive_load(url: str, queries: list[str], clients: int, requests: int) -> None:
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:

        async def one(i: int) -> None:
            for j in range(requests):
                body = {"model": "m", "input": [queries[(i * requests + j) % len(queries)]], "truncate": True}
                (await client.post("/v1/embeddings", json=body)).raise_for_status()

        await asyncio.gather(*(one(i) for i in range(clients)))


SECTIONS = {"replicas": replicas, "soak": soak, "kill9": kill9, "spread": spread}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("section", choices=sorted(SECTIONS))
    p.add_argument("--seconds", type=float, default=None, help="replicas: 60 in all (default); soak: 600")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--trials", type=int, default=6, help="kill9: trials (kills 0.2 s apart)")
    p.add_argument("--model-process", dest="server_flags", action="store_const", const=["--model-process"],
                   default=[], help="soak: the workers run their forwards in model processes")  # fmt: skip
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "cde_st_bench_serving"))
    args = p.parse_args()
    args.seconds = args.seconds or (600.0 if args.section == "soak" else 60.0)
    if not bench_serving.SCIFACT.is_dir():
        sys.exit(f"SciFact not found at {bench_serving.SCIFACT} (../shared/data beside the checkout).")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    folder = bench_serving.build_models(work, 512)["cde"]
    queries = bench_serving.scifact("queries")
    harness.log(f"{args.section}: load average {harness.load_average()}")
    rows = SECTIONS[args.section](folder, work, queries, args)
    table = [{k: v for k, v in row.items() if k != "memory samples"} for row in rows]
    print("\n".join(harness.markdown_table(list(table[0]), [list(r.values()) for r in table])))
    out = harness.write_json(
        work / f"results-{args.section}-{time.strftime('%Y%m%d-%H%M%S')}.json",
        {"command": harness.command_line(), "environment": harness.environment(), "load_average_end":
         harness.load_average(), "args": vars(args), "results": rows},
    )  # fmt: skip
    print(f"load average at the end {harness.load_average()}; wrote {out}")


if __name__ == "__main__":
    main()
