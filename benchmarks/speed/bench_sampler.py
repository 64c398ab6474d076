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
import time
from pathlib import Path

import numpy as np

from cde_st.batching import (
    ClusteredBatchSampler,
    cluster_pairs,
    distill_static_surrogate,
    embed_pairs,
    fit_static_surrogate,
    in_batch_negative_similarity,
    pack_clusters,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIRS = REPO / ".." / "shared" / "data" / "pairs"
# --static rewrites only the part of the results file between these lines (and the default run keeps it).
STATIC_BEGIN = "<!-- bench_sampler.py --static: begin -->"
STATIC_END = "<!-- bench_sampler.py --static: end -->"


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


def perturbed_pairs(
    queries: list[str], documents: list[str], domains: list[str], rows: int, seed: int
) -> tuple[list[str], list[str], list[str]]:
    """``rows`` pairs: the real pairs repeated; every copy after the first has, in each text, one word dropped
    and one word of the corpus inserted among its first 40 words (so copies differ where the surrogate reads)."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array(sorted({w for text in queries[:2000] + documents[:2000] for w in text.split()}))
    n = len(queries)

    def perturb(text: str, drop: int, insert: int, word: str) -> str:
        head, tail = text[:400], text[400:]
        words = head.split(" ")
        if len(words) > 1:
            del words[drop % len(words) % 40]
        words.insert(insert % (len(words) + 1) % 41, word)
        return " ".join(words) + tail

    out_q, out_d, out_domains = [], [], []
    for start in range(0, rows, n):
        count = min(n, rows - start)
        out_domains += domains[:count]
        if start == 0:
            out_q += queries[:count]
            out_d += documents[:count]
            continue
        picks = rng.integers(0, 2**31, size=(count, 4))
        words = vocabulary[rng.integers(len(vocabulary), size=(count, 2))]
        out_q += [perturb(queries[i], picks[i, 0], picks[i, 1], words[i, 0]) for i in range(count)]
        out_d += [perturb(documents[i], picks[i, 2], picks[i, 3], words[i, 1]) for i in range(count)]
    return out_q, out_d, out_domains


def static_benchmark(args: argparse.Namespace, header: list[str]) -> list[str]:
    """Sections 4 and 5 (the static surrogate); returns their markdown lines."""
    from cde_st.defaults import load_default_surrogate

    queries, documents, domains = load_pairs(args.pairs)
    n = len(queries)
    length = args.max_seq_length
    lines = list(header)

    # ---- the MiniLM yardstick (and today's surrogate) at the same length ------------------------------------
    if args.embeddings_cache is not None and args.embeddings_cache.exists():
        cached = np.load(args.embeddings_cache)
        q_ref, d_ref, ref_s = cached["q"], cached["d"], float(cached["embed_s"])
        ref_note = f"{ref_s:.0f}s when computed, cached in {args.embeddings_cache}"
    else:
        surrogate = load_default_surrogate(device="cpu")
        start = time.perf_counter()
        q_ref, d_ref = embed_pairs(surrogate, queries, documents, max_seq_length=length, show_progress_bar=True)
        ref_s = time.perf_counter() - start
        ref_note = f"{ref_s:.0f}s, computed in this run"
        if args.embeddings_cache is not None:
            args.embeddings_cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(args.embeddings_cache, q=q_ref, d=d_ref, embed_s=ref_s)
    print(f"MiniLM yardstick: {ref_note}", flush=True)

    # ---- distillation (once) -------------------------------------------------------------------------------
    cache_dir = args.static_cache
    if cache_dir is None:
        import tempfile

        cache_dir = Path(tempfile.mkdtemp(prefix="cde_st_surrogates-"))
    start = time.perf_counter()
    distill_static_surrogate(cache_dir=cache_dir)
    distill_s = time.perf_counter() - start
    print(f"distill: {distill_s:.1f}s (load {load_average()})", flush=True)

    # ---- 4. hardness on the real pairs ----------------------------------------------------------------------
    start = time.perf_counter()
    static = fit_static_surrogate(
        None, queries, documents, fit_pairs=args.static_fit_pairs, dims=args.static_dims,
        max_seq_length=length, seed=args.seed, cache_dir=cache_dir,
    )  # fmt: skip
    prepared_s = time.perf_counter() - start
    q_static, d_static = embed_pairs(static, queries, documents, max_seq_length=length)
    print(f"static on {n} pairs: prepare {prepared_s:.1f}s {static.timings}", flush=True)

    def hardness(q_emb: np.ndarray, d_emb: np.ndarray, cluster_size: int) -> tuple[float, int]:
        result = cluster_pairs(q_emb, d_emb, cluster_size, args.seed, domains=domains, niter=args.niter)
        batches = pack_clusters(
            result.labels, result.centroids, args.batch_size, cluster_domains=result.cluster_domains
        )
        return in_batch_negative_similarity(batches, q_ref, d_ref), result.num_clusters

    rng = np.random.default_rng(args.seed)
    random_sim = in_batch_negative_similarity(random_batches(np.arange(n), args.batch_size, rng), q_ref, d_ref)
    table = [
        f"## 4. Static surrogate: batch hardness of the {n:,} shared pairs at batch size {args.batch_size}",
        "",
        f"Hardness = mean cosine similarity, in all-MiniLM-L6-v2 embeddings at length {length} (the yardstick, "
        f"{ref_note}), between each query and the other documents of its batch; clustering within domains, "
        f"greedy tour. Static surrogate: distilled from MiniLM with model2vec (256-d table), fitted to MiniLM "
        f"on {args.static_fit_pairs} random pairs of the data, PCA to {args.static_dims} dims "
        f'(`surrogate_kind="static"` defaults); both surrogates truncate at {length} tokens.',
        "",
        "| cluster size | clusters | MiniLM surrogate | static surrogate | difference |",
        "|---|---|---|---|---|",
    ]
    for cluster_size in args.cluster_sizes:
        minilm, k = hardness(q_ref, d_ref, cluster_size)
        fast, _ = hardness(q_static, d_static, cluster_size)
        table.append(f"| {cluster_size} | {k} | {minilm:.4f} | {fast:.4f} | {fast - minilm:+.4f} |")
        print(table[-1], flush=True)
    table += [f"| random batches | - | {random_sim:.4f} | {random_sim:.4f} | - |", ""]
    lines += table

    # ---- 5. 1M pairs end to end -----------------------------------------------------------------------------
    rows = args.static_rows
    start = time.perf_counter()
    big_q, big_d, big_domains = perturbed_pairs(queries, documents, domains, rows, args.seed)
    build_s = time.perf_counter() - start
    distinct = len(set(big_q)) + len(set(big_d))
    print(f"built {rows} pairs in {build_s:.0f}s ({distinct} distinct texts); load {load_average()}", flush=True)
    cluster_size = args.static_cluster_size
    load_start = load_average()
    steps: list[tuple[str, float]] = []
    total_start = time.perf_counter()
    static = fit_static_surrogate(
        None, big_q, big_d, fit_pairs=args.static_fit_pairs, dims=args.static_dims, max_seq_length=length,
        seed=args.seed, cache_dir=cache_dir,
    )  # fmt: skip
    steps += [
        ("load the distilled model (cached)", static.timings["load_s"]),
        (f"MiniLM on the fit sample ({args.static_fit_pairs} pairs, length {length})", static.timings["teacher_s"]),
        (f"fit the static table and map, PCA to {args.static_dims} dims", static.timings["fit_s"]),
    ]
    teacher_rate = 2 * args.static_fit_pairs / max(static.timings["teacher_s"], 1e-9)
    tokenize_s = pool_s = 0.0
    embedded = []
    for texts in (big_q, big_d):
        embedded.append(static.encode(texts, max_seq_length=length))
        tokenize_s += static.timings["tokenize_s"]
        pool_s += static.timings["pool_s"]
    steps += [
        (f"tokenise {2 * rows:,} texts (length {length})", tokenize_s),
        ("pool token rows (mean, projection)", pool_s),
    ]
    start = time.perf_counter()
    result = cluster_pairs(embedded[0], embedded[1], cluster_size, args.seed, domains=big_domains, niter=args.niter)
    steps.append(
        (f"k-means + assignment within the 8 domains ({result.num_clusters} clusters)", time.perf_counter() - start)
    )
    start = time.perf_counter()
    batches = pack_clusters(result.labels, result.centroids, args.batch_size, cluster_domains=result.cluster_domains)
    steps.append((f"pack into {len(batches):,} batches of {args.batch_size}", time.perf_counter() - start))
    total_s = time.perf_counter() - total_start
    load_end = load_average()
    print(f"end to end: {total_s:.1f}s {steps}", flush=True)

    start = time.perf_counter()
    one_domain = cluster_pairs(embedded[0], embedded[1], cluster_size, args.seed, niter=args.niter)
    one_domain_s = time.perf_counter() - start
    del embedded

    from datasets import Dataset

    dataset = Dataset.from_dict({"query": big_q, "document": big_d})
    print(f"ClusteredBatchSampler end to end (load {load_average()})", flush=True)
    start = time.perf_counter()
    sampler = ClusteredBatchSampler(
        dataset, args.batch_size, False, seed=args.seed, cluster_size=cluster_size, domains=big_domains,
        surrogate_kind="static", static_fit_pairs=args.static_fit_pairs, static_dims=args.static_dims,
        max_seq_length=length, niter=args.niter, cache=False, show_progress_bar=False,
    )  # fmt: skip
    sampler_s = time.perf_counter() - start
    print(f"sampler: {sampler_s:.1f}s {sampler.timings}", flush=True)

    section = [
        f"## 5. Static surrogate: clustered batches for {rows:,} pairs end to end (CPU)",
        "",
        f"The {n:,} shared pairs repeated to {rows:,} rows, every copy perturbed (in each text a word dropped and "
        f"a corpus word inserted among its first 40 words; {distinct:,} distinct texts of {2 * rows:,}; built in "
        f"{build_s:.0f}s, not counted). Length {length}, cluster size {cluster_size}, batch size {args.batch_size}, "
        f"faiss spherical k-means niter {args.niter} within the 8 domains. Load average (1/5/15 min) at the start "
        f"of the timed steps {load_start}, at their end {load_end}.",
        "",
        "| step | wall time (s) |",
        "|---|---|",
        f"| distil the static surrogate from MiniLM (once per source model, then cached; not counted below) "
        f"| {distill_s:.1f} |",
        *[f"| {name} | {seconds:.1f} |" for name, seconds in steps],
        f"| **total** | **{total_s:.1f}** |",
        f"| (for comparison) k-means + assignment ignoring domains, one k-means of {rows:,} pairs "
        f"({one_domain.num_clusters} clusters) | {one_domain_s:.1f} |",
        f'| the same preparation through `ClusteredBatchSampler(surrogate_kind="static", cache=False)`, '
        f"including hashing the texts for the cache key | {sampler_s:.1f} |",
        "",
        f"For scale: in this run the MiniLM surrogate embedded the fit sample ({2 * args.static_fit_pairs:,} texts, "
        f"length {length}) at {teacher_rate:.0f} texts/s; at that rate embedding all {2 * rows:,} texts with it "
        f"would take {2 * rows / teacher_rate:.0f}s. (The yardstick's {2 * n:,} texts took {ref_s:.0f}s when "
        "computed, in another run.)",
        "",
    ]
    lines += section
    print("\n".join(section), flush=True)
    return lines


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
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "speed" / "RESULTS_sampler.md")
    parser.add_argument("--static", action="store_true", help="measure the static surrogate (sections 4-5) only")
    parser.add_argument("--static-rows", type=int, default=1_000_000, help="pairs of the end-to-end run")
    parser.add_argument("--static-cluster-size", type=int, default=1024, help="cluster size of the end-to-end run")
    parser.add_argument("--static-fit-pairs", type=int, default=4096)
    parser.add_argument("--static-dims", type=int, default=128)
    parser.add_argument(
        "--static-cache", type=Path, default=None, help="distilled-model cache (default: a new temporary folder)"
    )
    args = parser.parse_args()

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
    machine += f"; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    if args.static:
        header = [
            STATIC_BEGIN,
            '# The fast static surrogate (`surrogate_kind="static"`)',
            "",
            f"Command (repository root): `{command}`",
            "",
            f"Machine: {machine}. Shared with other jobs: load average (1/5/15 min) at start {load_average()}.",
            "",
        ]
        print("\n".join(header), flush=True)
        section = static_benchmark(args, header)
        section += [f"Load average at the end: {load_average()} (2 cores).", STATIC_END]
        text = args.output.read_text() if args.output.exists() else ""
        if STATIC_BEGIN in text and STATIC_END in text:
            before, rest = text.split(STATIC_BEGIN, 1)
            text = before + "\n".join(section) + rest.split(STATIC_END, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
        args.output.write_text(text)
        print(f"wrote {args.output}")
        return

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
        from cde_st.defaults import load_default_surrogate

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
    previous = args.output.read_text() if args.output.exists() else ""
    if STATIC_BEGIN in previous and STATIC_END in previous:  # keep the --static section
        lines += ["", STATIC_BEGIN + previous.split(STATIC_BEGIN, 1)[1].split(STATIC_END, 1)[0] + STATIC_END]
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
