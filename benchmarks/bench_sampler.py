"""Contextual batching benchmark: clustering wall time and batch hardness (cde_st.batching).

Measures, with the same functions ClusteredBatchSampler runs:
  1. the 30,995 real pairs of ../shared/data/pairs: surrogate embedding time (all-MiniLM-L6-v2) and k-means time;
  2. batch hardness (mean surrogate cosine similarity between a query and the other documents of its batch)
     at batch size 64 for several cluster sizes, against random batches;
  3. k-means time on synthetic pairs (default 1,000,000 pairs of 384-d unit vectors around random topics).

Run from the repository root:
    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/bench_sampler.py
Results go to benchmarks/RESULTS_sampler.md (and the console).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from cde_st.batching import cluster_pairs, embed_pairs, in_batch_negative_similarity, pack_clusters

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PAIRS = REPO / ".." / "shared" / "data" / "pairs"


def load_pairs(folder: Path) -> tuple[list[str], list[str], list[str]]:
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


def random_batches(rows: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    perm = rng.permutation(rows)
    return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]


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


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> None:
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
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "RESULTS_sampler.md")
    args = parser.parse_args()

    import faiss
    import torch

    command = "HF_HUB_OFFLINE=1 PYTHONPATH=. python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]
    )
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU; "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), faiss {faiss.__version__} "
        f"({faiss.omp_get_max_threads()} OpenMP threads, {faiss.get_num_gpus()} GPUs)"
    )
    lines = [
        "# Contextual batching benchmark (cde_st.batching)",
        "",
        f"Command (repository root): `{command}`",
        "",
        f"Machine: {machine}. Shared with other jobs: load average (1/5/15 min) at start {load_average()}.",
        "",
    ]
    print("\n".join(lines), flush=True)

    # ---- 1. real pairs: embedding and k-means time ------------------------------------------------------------
    queries, documents, domains = load_pairs(args.pairs)
    n = len(queries)
    domain_names = list(dict.fromkeys(domains))
    print(f"{n} pairs in {len(domain_names)} domains", flush=True)
    if args.embeddings_cache is not None and args.embeddings_cache.exists():
        cached = np.load(args.embeddings_cache)
        q_emb, d_emb, embed_s, embed_note = cached["q"], cached["d"], float(cached["embed_s"]), " (cached run)"
    else:
        from cde_st._defaults import load_default_surrogate

        surrogate = load_default_surrogate(device="cpu")
        start = time.perf_counter()
        q_emb, d_emb = embed_pairs(
            surrogate,
            queries,
            documents,
            batch_size=args.encode_batch_size,
            max_seq_length=args.max_seq_length,
            show_progress_bar=True,
        )
        embed_s, embed_note = time.perf_counter() - start, ""
        if args.embeddings_cache is not None:
            args.embeddings_cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(args.embeddings_cache, q=q_emb, d=d_emb, embed_s=embed_s)
    max_len = args.max_seq_length or 256
    print(f"embedding: {embed_s:.1f}s", flush=True)

    rows = [
        f"## 1. Clustering wall time on the {n:,} shared pairs",
        "",
        f"Surrogate all-MiniLM-L6-v2 (offline copy), max_seq_length {max_len}, encode batch {args.encode_batch_size}; "
        f"k-means: faiss spherical, niter {args.niter}, within each of the {len(domain_names)} domains.",
        "",
        "| step | wall time (s) |",
        "|---|---|",
        f"| embed {n} queries + {n} documents (CPU){embed_note} | {embed_s:.1f} |",
    ]
    start = time.perf_counter()
    clustering = cluster_pairs(
        q_emb, d_emb, args.timing_cluster_size, args.seed, domains=domains, niter=args.niter, show_progress_bar=True
    )
    kmeans_s = time.perf_counter() - start
    start = time.perf_counter()
    pack_clusters(clustering.labels, clustering.centroids, args.batch_size, cluster_domains=clustering.cluster_domains)
    pack_s = time.perf_counter() - start
    rows += [
        f"| k-means, cluster size {args.timing_cluster_size} ({clustering.num_clusters} clusters) | {kmeans_s:.2f} |",
        f"| pack into batches of {args.batch_size} (greedy centroid tour) | {pack_s:.3f} |",
        "",
    ]
    print("\n".join(rows), flush=True)
    lines += rows

    # ---- 2. batch hardness ------------------------------------------------------------------------------------
    rng = np.random.default_rng(args.seed)
    all_rows = np.arange(n)
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
        start = time.perf_counter()
        result = cluster_pairs(q_emb, d_emb, cs, args.seed, domains=domains if by_domain else None, niter=args.niter)
        seconds = time.perf_counter() - start
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
    lines += table
    print("\n".join(table), flush=True)

    # ---- 3. synthetic 1M pairs: k-means time --------------------------------------------------------------------
    if args.synthetic_rows > 0:
        start = time.perf_counter()
        q_syn, d_syn = synthetic_pairs(args.synthetic_rows, args.synthetic_dim, args.synthetic_topics, args.seed)
        gen_s = time.perf_counter() - start
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
            start = time.perf_counter()
            result = cluster_pairs(q_syn, d_syn, cs, args.seed, niter=args.niter, show_progress_bar=True)
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            pack_clusters(result.labels, result.centroids, args.batch_size)
            pack_s = time.perf_counter() - start
            points = min(2 * args.synthetic_rows, 256 * result.num_clusters)
            syn.append(f"| {cs} | {result.num_clusters} | {points:,} | {seconds:.1f} | {pack_s:.2f} |")
            print(syn[-1], flush=True)
        syn.append("")
        lines += syn

    lines.append(f"Load average at the end: {load_average()} (2 cores; other engineers' jobs ran concurrently).")
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
