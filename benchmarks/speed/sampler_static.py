"""Sections 4 and 5 of ``bench_sampler.py --static``: the fast static surrogate (``surrogate_kind="static"``).

4. batch hardness of the shared pairs clustered with the static surrogate against the all-MiniLM-L6-v2 surrogate at
   the same length (MiniLM embeddings are the yardstick for both);
5. clustered-batch preparation of 1,000,000 pairs end to end (the real pairs repeated, each copy perturbed), step by
   step, then once more through ``ClusteredBatchSampler`` itself.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from harness import load_average, timed_calls

from cde_st.batching import (
    ClusteredBatchSampler,
    cluster_pairs,
    distill_static_surrogate,
    embed_pairs,
    fit_static_surrogate,
    in_batch_negative_similarity,
    pack_clusters,
)

__all__ = ["perturbed_pairs", "random_batches", "static_benchmark", "yardstick_embeddings"]


def random_batches(rows: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``rows`` shuffled and cut into batches: the baseline every clustering is compared with."""
    perm = rng.permutation(rows)
    return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]


def yardstick_embeddings(args: argparse.Namespace, queries: list[str], documents: list[str], **encode) -> tuple:
    """MiniLM's (query, document) embeddings of the pairs, the seconds they took and a note on where they came
    from: read from ``--embeddings-cache`` when it exists, else computed (and saved there when it is given)."""
    if args.embeddings_cache is not None and args.embeddings_cache.exists():
        cached = np.load(args.embeddings_cache)
        seconds = float(cached["embed_s"])
        return cached["q"], cached["d"], seconds, f"{seconds:.0f}s when computed, cached in {args.embeddings_cache}"
    from cde_st.defaults import load_default_surrogate

    surrogate = load_default_surrogate(device="cpu")
    (seconds,), (q, d) = timed_calls(
        lambda: embed_pairs(surrogate, queries, documents, show_progress_bar=True, **encode)
    )
    if args.embeddings_cache is not None:
        args.embeddings_cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.embeddings_cache, q=q, d=d, embed_s=seconds)
    return q, d, seconds, f"{seconds:.0f}s, computed in this run"


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


def static_benchmark(args: argparse.Namespace, pairs: tuple[list[str], list[str], list[str]]) -> list[str]:
    """Sections 4 and 5 on the shared ``pairs`` (queries, documents, domains); returns their Markdown lines."""
    queries, documents, _ = pairs
    q_ref, d_ref, ref_s, ref_note = yardstick_embeddings(args, queries, documents, max_seq_length=args.max_seq_length)
    print(f"MiniLM yardstick: {ref_note}", flush=True)
    cache_dir = args.static_cache or Path(tempfile.mkdtemp(prefix="cde_st_surrogates-"))
    (distill_s,), _ = timed_calls(lambda: distill_static_surrogate(cache_dir=cache_dir))  # once, then cached
    print(f"distill: {distill_s:.1f}s (load {load_average()})", flush=True)
    lines = hardness_section(args, pairs, (q_ref, d_ref), ref_note, cache_dir)
    lines += end_to_end_section(args, pairs, cache_dir, distill_s, ref_s)
    return lines


def hardness_section(args, pairs, reference: tuple, ref_note: str, cache_dir: Path) -> list[str]:
    """Section 4: in-batch hardness (in MiniLM's embeddings) of batches clustered with either surrogate."""
    queries, documents, domains = pairs
    q_ref, d_ref = reference
    n, length = len(queries), args.max_seq_length
    (prepared_s,), static = timed_calls(
        lambda: fit_static_surrogate(
            None,
            queries,
            documents,
            fit_pairs=args.static_fit_pairs,
            dims=args.static_dims,
            max_seq_length=length,
            seed=args.seed,
            cache_dir=cache_dir,
        )  # fmt: skip
    )
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
    return table + [f"| random batches | - | {random_sim:.4f} | {random_sim:.4f} | - |", ""]


def prepare_step_by_step(args, big: tuple, cache_dir: Path) -> tuple[list[tuple[str, float]], float, list]:
    """Section 5's timed steps on the ``big`` pairs: fit the static surrogate, embed every text, k-means within the
    domains, pack. Returns (step, seconds) rows, MiniLM's rate on the fit sample (texts/s) and the embeddings."""
    big_q, big_d, big_domains = big
    length, rows = args.max_seq_length, len(big_q)
    static = fit_static_surrogate(
        None, big_q, big_d, fit_pairs=args.static_fit_pairs, dims=args.static_dims, max_seq_length=length,
        seed=args.seed, cache_dir=cache_dir,
    )  # fmt: skip
    steps = [
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
    (kmeans_s,), result = timed_calls(
        lambda: cluster_pairs(
            embedded[0], embedded[1], args.static_cluster_size, args.seed, domains=big_domains, niter=args.niter
        )  # fmt: skip
    )
    steps.append((f"k-means + assignment within the 8 domains ({result.num_clusters} clusters)", kmeans_s))
    (pack_s,), batches = timed_calls(
        lambda: pack_clusters(result.labels, result.centroids, args.batch_size, cluster_domains=result.cluster_domains)
    )
    steps.append((f"pack into {len(batches):,} batches of {args.batch_size}", pack_s))
    return steps, teacher_rate, embedded


def end_to_end_section(args, pairs, cache_dir: Path, distill_s: float, ref_s: float) -> list[str]:
    """Section 5: clustered batches for ``--static-rows`` pairs, step by step and through the sampler."""
    queries, documents, domains = pairs
    n, rows, length, cluster_size = len(queries), args.static_rows, args.max_seq_length, args.static_cluster_size
    (build_s,), big = timed_calls(lambda: perturbed_pairs(queries, documents, domains, rows, args.seed))
    distinct = len(set(big[0])) + len(set(big[1]))
    print(f"built {rows} pairs in {build_s:.0f}s ({distinct} distinct texts); load {load_average()}", flush=True)
    load_start = load_average()
    (total_s,), (steps, teacher_rate, embedded) = timed_calls(lambda: prepare_step_by_step(args, big, cache_dir))
    load_end = load_average()
    print(f"end to end: {total_s:.1f}s {steps}", flush=True)
    (one_domain_s,), one_domain = timed_calls(
        lambda: cluster_pairs(embedded[0], embedded[1], cluster_size, args.seed, niter=args.niter)
    )
    embedded.clear()  # a million embeddings: free them before the sampler makes its own

    from datasets import Dataset

    dataset = Dataset.from_dict({"query": big[0], "document": big[1]})
    print(f"ClusteredBatchSampler end to end (load {load_average()})", flush=True)
    (sampler_s,), sampler = timed_calls(
        lambda: ClusteredBatchSampler(
            dataset,
            args.batch_size,
            False,
            seed=args.seed,
            cluster_size=cluster_size,
            domains=big[2],
            surrogate_kind="static",
            static_fit_pairs=args.static_fit_pairs,
            static_dims=args.static_dims,
            max_seq_length=length,
            niter=args.niter,
            cache=False,
            show_progress_bar=False,
        )  # fmt: skip
    )
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
    print("\n".join(section), flush=True)
    return section
