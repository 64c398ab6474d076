"""Contextual batching benchmark: clustering wall time and batch hardness (cde_st.batching).

Measures, with the same functions ClusteredBatchSampler runs:
  1. the 30,995 real pairs of ../shared/data/pairs: surrogate embedding time (all-MiniLM-L6-v2) and k-means time;
  2. batch hardness (mean surrogate cosine similarity between a query and the other documents of its batch)
     at batch size 64 for several cluster sizes, against random batches;
  3. k-means time on synthetic pairs (default 1,000,000 pairs of 384-d unit vectors around random topics).

Run from the repository root:
    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/speed/bench_sampler.py
Results go to benchmarks/speed/RESULTS_sampler.md (and the console).

With --static, measures the fast static surrogate instead (surrogate_kind="static") and rewrites only its own
section of RESULTS_sampler.md:
  4. batch hardness of the 30,995 real pairs at batch size 64, clustered with the static surrogate vs with the
     all-MiniLM-L6-v2 surrogate at the same length (MiniLM embeddings are the yardstick for both);
  5. clustered-batch preparation of 1,000,000 pairs end to end (the real pairs repeated, each copy perturbed:
     a word dropped and a word inserted near the start), step by step, then once more through
     ClusteredBatchSampler itself.
    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/speed/bench_sampler.py --static --max-seq-length 64 \
        --embeddings-cache /tmp/cde_bench/minilm_len64.npz
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder's modules and the shared benchmarks/harness.py

from harness import load_average, timed_calls  # noqa: E402
from sampler_static import random_batches, static_benchmark, yardstick_embeddings  # noqa: E402

from cde_st.batching import cluster_pairs, in_batch_negative_similarity, pack_clusters  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIRS = REPO / ".." / "shared" / "data" / "pairs"
# --static rewrites only the part of the results file between these lines (and the default run keeps it).
STATIC_BEGIN = "<!-- bench_sampler.py --static: begin -->"
STATIC_END = "<!-- bench_sampler.py --static: end -->"


REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIRS = REPO / ".." / "shared" / "data" / "pairs"
# --static rewrites only the part of the results file between these lines (and the default run keeps it).
STATIC_BEGIN = "<!-- bench_sampler.py --static: begin -->"
STATIC_END = "<!-- bench_sampler.py --static: end -->"


def load_pairs(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """(queries, documents, domains) of every ``*.jsonl.gz`` pair file in ``folder``."""
    queries, documents, domains = [], [], []
    files = sorted(folder.glob("*.jsonl.gz"))
    if not files:
        sys.exit(f"No pairs/*.jsonl.gz under {folder}: pass --pairs PATH (the shared data is not in the repository).")
    for file in files:
        with gzip.open(file, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                queries.append(row["query"])
                documents.append(row["document"])
                domains.append(row["domain"])
    return queries, documents, domains


def synthetic_pairs(n: int, dim: int, topics: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around ``topics`` random directions; a query and its document share a topic."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((topics, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    q = np.empty((n, dim), dtype=np.float32)
    d = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        stop = min(start + 100_000, n)
        topic = rng.integers(topics, size=stop - start)
        for out in (q, d):
            # Noise of norm ~1 around a unit centre: same-topic cosine ~0.5, cross-topic ~0.
            out[start:stop] = centres[topic] + rng.standard_normal((stop - start, dim), dtype=np.float32) / np.sqrt(dim)
            out[start:stop] /= np.linalg.norm(out[start:stop], axis=1, keepdims=True)
    return q, d


def clustering_time_section(args, pairs, embedded: tuple) -> list[str]:
    """Section 1: embedding, k-means and packing time on the shared pairs."""
    queries, _, domains = pairs
    q_emb, d_emb, embed_s, embed_note = embedded
    n, domain_count = len(queries), len(set(domains))
    max_len = args.max_seq_length or 256
    rows = [
        f"## 1. Clustering wall time on the {n:,} shared pairs",
        "",
        f"Surrogate all-MiniLM-L6-v2 (offline copy), max_seq_length {max_len}, encode batch {args.encode_batch_size}; "
        f"k-means: faiss spherical, niter {args.niter}, within each of the {domain_count} domains.",
        "",
        "| step | wall time (s) |",
        "|---|---|",
        f"| embed {n} queries + {n} documents (CPU; {embed_note}) | {embed_s:.1f} |",
    ]
    (kmeans_s,), clustering = timed_calls(
        lambda: cluster_pairs(
            q_emb,
            d_emb,
            args.timing_cluster_size,
            args.seed,
            domains=domains,
            niter=args.niter,
            show_progress_bar=True,
        )  # fmt: skip
    )
    (pack_s,), _ = timed_calls(
        lambda: pack_clusters(
            clustering.labels, clustering.centroids, args.batch_size, cluster_domains=clustering.cluster_domains
        )
    )
    rows += [
        f"| k-means, cluster size {args.timing_cluster_size} ({clustering.num_clusters} clusters) | {kmeans_s:.2f} |",
        f"| pack into batches of {args.batch_size} (greedy centroid tour) | {pack_s:.3f} |",
        "",
    ]
    print("\n".join(rows), flush=True)
    return rows


def hardness_section(args, pairs, q_emb: np.ndarray, d_emb: np.ndarray) -> list[str]:
    """Section 2: in-batch hardness of random and clustered batches."""
    domains = pairs[2]
    domain_names = list(dict.fromkeys(domains))
    rng = np.random.default_rng(args.seed)
    all_rows = np.arange(len(domains))
    codes = np.array([domain_names.index(x) for x in domains])
    table = [
        f"## 2. Batch hardness at batch size {args.batch_size} on the shared pairs",
        "",
        "Hardness = mean cosine similarity (same MiniLM surrogate) between each query and the *other* documents "
        "of its batch, over all batches of one epoch (every pair once). Higher = harder in-batch negatives. "
        "Clustering within domains, greedy tour packing unless noted.",
        "",
        "| batching | clusters | k-means (s) | mean in-batch negative sim |",
        "|---|---|---|---|",
    ]
    random_sim = in_batch_negative_similarity(random_batches(all_rows, args.batch_size, rng), q_emb, d_emb)
    table.append(f"| random (all domains mixed) | - | - | {random_sim:.4f} |")
    per_domain = [
        b for c in range(len(domain_names)) for b in random_batches(all_rows[codes == c], args.batch_size, rng)
    ]
    table.append(
        f"| random within each domain | - | - | {in_batch_negative_similarity(per_domain, q_emb, d_emb):.4f} |"
    )
    variants = [(cs, "greedy", True) for cs in args.cluster_sizes]
    variants += [(args.cluster_sizes[0], "random", True), (args.batch_size, "greedy", False)]
    for cs, order, by_domain in variants:
        (seconds,), result = timed_calls(
            lambda cs=cs, by_domain=by_domain: cluster_pairs(
                q_emb, d_emb, cs, args.seed, domains=domains if by_domain else None, niter=args.niter
            )
        )
        batches = pack_clusters(
            result.labels, result.centroids, args.batch_size, cluster_domains=result.cluster_domains, order=order
        )
        sim = in_batch_negative_similarity(batches, q_emb, d_emb)
        label = f"clustered, cluster size {cs}"
        if order == "random":
            label += ", random cluster order"
        if not by_domain:
            label += ", ignoring domains"
        table.append(f"| {label} | {result.num_clusters} | {seconds:.2f} | {sim:.4f} |")
        print(f"  {label}: {sim:.4f}", flush=True)
    table.append("")
    print("\n".join(table), flush=True)
    return table


def synthetic_section(args) -> list[str]:
    """Section 3: k-means and packing time on synthetic pairs."""
    (gen_s,), (q_syn, d_syn) = timed_calls(
        lambda: synthetic_pairs(args.synthetic_rows, args.synthetic_dim, args.synthetic_topics, args.seed)
    )
    syn = [
        f"## 3. k-means wall time on {args.synthetic_rows:,} synthetic {args.synthetic_dim}-d pairs",
        "",
        f"Unit vectors around {args.synthetic_topics} random topic directions (generated in {gen_s:.0f}s, "
        "not counted). One domain; faiss spherical k-means on the [q;d]/[d;q] points, subsampled to "
        f"256 per centroid; niter {args.niter}; then every pair assigned by its [q;d] point, then packed "
        f"into batches of {args.batch_size}.",
        "",
        "| cluster size | clusters | training points | k-means + assignment (s) | pack (s) |",
        "|---|---|---|---|---|",
    ]
    for cs in args.synthetic_cluster_sizes:
        print(f"synthetic k-means, cluster size {cs} (load {load_average()})", flush=True)
        (seconds,), result = timed_calls(
            lambda cs=cs: cluster_pairs(q_syn, d_syn, cs, args.seed, niter=args.niter, show_progress_bar=True)
        )
        (pack_s,), _ = timed_calls(
            lambda result=result: pack_clusters(result.labels, result.centroids, args.batch_size)
        )
        points = min(2 * args.synthetic_rows, 256 * result.num_clusters)
        syn.append(f"| {cs} | {result.num_clusters} | {points:,} | {seconds:.1f} | {pack_s:.2f} |")
        print(syn[-1], flush=True)
    return syn + [""]


def command_and_machine(args: argparse.Namespace) -> tuple[str, str]:
    """The command as typed (with the environment settings that matter) and the machine, for the results file."""
    import faiss
    import torch

    settings = [f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM") if k in os.environ]
    command = (
        " ".join([*settings, "HF_HUB_OFFLINE=1 PYTHONPATH=. python"])
        + " "
        + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
    )
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU; "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), faiss {faiss.__version__} "
        f"({faiss.omp_get_max_threads()} OpenMP threads, {faiss.get_num_gpus()} GPUs)"
    )
    # OpenMP threads that spin while they wait cost a lot on a machine shared with other jobs: say how it was set.
    return command, machine + f"; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"


def write_static(args: argparse.Namespace, section: list[str]) -> None:
    """Replace the --static part of the results file (or append it)."""
    text = args.output.read_text() if args.output.exists() else ""
    if STATIC_BEGIN in text and STATIC_END in text:
        before, rest = text.split(STATIC_BEGIN, 1)
        text = before + "\n".join(section) + rest.split(STATIC_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    args.output.write_text(text)
    print(f"wrote {args.output}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS, help="folder of pairs/*.jsonl.gz")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cluster-sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--timing-cluster-size", type=int, default=64, help="cluster size of the real-data timing")
    parser.add_argument("--max-seq-length", type=int, default=None, help="surrogate truncation (default: model's)")
    parser.add_argument("--encode-batch-size", type=int, default=64)
    parser.add_argument("--embeddings-cache", type=Path, default=None, help="reuse/save the real-pair embeddings")
    parser.add_argument("--synthetic-rows", type=int, default=1_000_000, help="0 skips the synthetic run")
    parser.add_argument("--synthetic-dim", type=int, default=384)
    parser.add_argument("--synthetic-topics", type=int, default=4096)
    parser.add_argument("--synthetic-cluster-sizes", type=int, nargs="+", default=[1024, 512])
    parser.add_argument("--niter", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "speed" / "RESULTS_sampler.md")
    parser.add_argument("--static", action="store_true", help="measure the static surrogate (sections 4-5) only")
    parser.add_argument("--static-rows", type=int, default=1_000_000, help="pairs of the end-to-end run")
    parser.add_argument("--static-cluster-size", type=int, default=1024, help="cluster size of the end-to-end run")
    parser.add_argument("--static-fit-pairs", type=int, default=4096)
    parser.add_argument("--static-dims", type=int, default=128)
    parser.add_argument(
        "--static-cache", type=Path, default=None, help="distilled-model cache (default: a new temporary folder)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    command, machine = command_and_machine(args)
    title = (
        '# The fast static surrogate (`surrogate_kind="static"`)'
        if args.static
        else ("# Contextual batching benchmark (cde_st.batching)")
    )
    lines = [
        *([STATIC_BEGIN] if args.static else []),
        title,
        "",
        f"Command (repository root): `{command}`",
        "",
        f"Machine: {machine}. Shared with other jobs: load average (1/5/15 min) at start {load_average()}.",
        "",
    ]
    print("\n".join(lines), flush=True)
    pairs = load_pairs(args.pairs)
    if args.static:
        lines += static_benchmark(args, pairs)
        write_static(args, lines + [f"Load average at the end: {load_average()} (2 cores).", STATIC_END])
        return
    print(f"{len(pairs[0])} pairs in {len(set(pairs[2]))} domains", flush=True)
    embedded = yardstick_embeddings(
        args, pairs[0], pairs[1], batch_size=args.encode_batch_size, max_seq_length=args.max_seq_length
    )
    print(f"embedding: {embedded[2]:.1f}s", flush=True)
    lines += clustering_time_section(args, pairs, embedded)
    lines += hardness_section(args, pairs, embedded[0], embedded[1])
    if args.synthetic_rows > 0:
        lines += synthetic_section(args)
    lines.append(f"Load average at the end: {load_average()} (2 cores; other engineers' jobs ran concurrently).")
    previous = args.output.read_text() if args.output.exists() else ""
    if STATIC_BEGIN in previous and STATIC_END in previous:  # keep the --static section
        lines += ["", STATIC_BEGIN + previous.split(STATIC_BEGIN, 1)[1].split(STATIC_END, 1)[0] + STATIC_END]
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
