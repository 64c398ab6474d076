"""Does a contextual model lean on its *own positive* being in the context?

During training the context of a batch is the batch's own documents (DESIGN.md, section 1.6), so every query sees
its positive document among the context tokens. At test time the positive is one of thousands of corpus documents
and almost never among the J sampled ones. This probe scores held-out (query, positive) pairs in batches of B, as
in training, under two contexts of the same size:

  own    the batch's own B positives (the training condition: the positive is in the context);
  other  B documents drawn from the rest of the corpus (the test condition: it is not).

It reports in-batch top-1 accuracy, the InfoNCE loss at the training temperature, and the mean cosine of the
positive pairs. A plain bi-encoder ignores context, so both rows are equal for it; a gap `own - other` that grows
with training means the model learned to use the context as a lookup table for the answer.

    python benchmarks/quality/probe_context_leak.py --model d=runs/mini-d-cde-clustered-filtered/final \
        --model init=init:minilm:64 --model c=runs/mini-c-bi-clustered-filtered/final

`init:BASE:J` builds the untrained contextual model with the trainer's `build_model` (`mini` preset, no prompts).
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch

from cde_st import ContextualSentenceTransformer, is_contextual
from cde_st.data import document_text
from cde_st.evaluation.local_tasks import load_retrieval_split
from cde_st.training import TrainConfig, build_model


def load_model(spec: str, max_seq_length: int):
    from sentence_transformers import SentenceTransformer

    if spec.startswith("init:"):  # the untrained model exactly as the trainer builds it
        _, base, size = spec.split(":")
        cfg = TrainConfig.from_preset(
            "mini",
            base_model=base,
            context_size=int(size),
            max_seq_length=max_seq_length,
            query_prompt="",
            document_prompt="",
        )
        model = build_model(cfg)
    elif os.path.exists(os.path.join(spec, "cde_config.json")):
        model = ContextualSentenceTransformer(spec)
    else:
        model = SentenceTransformer(spec)
    model.max_seq_length = max_seq_length
    model.eval()
    return model


def held_out_batches(folder: str, split: str, batch_size: int, seed: int):
    """(queries, positives, other-corpus documents) per batch of ``batch_size`` judged queries."""
    data = load_retrieval_split(folder, split)
    corpus = data["corpus"]
    docs = {i: document_text(t, x) for i, t, x in zip(corpus["id"], corpus["title"], corpus["text"])}
    qtext = dict(zip(data["queries"]["id"], data["queries"]["text"]))
    pairs = []
    for qid, rel in sorted(data["relevant_docs"].items()):
        positives = sorted(d for d, s in rel.items() if s > 0 and d in docs)
        if qid in qtext and positives:
            pairs.append((qtext[qid], positives[0]))
    rng = random.Random(seed)
    rng.shuffle(pairs)
    doc_ids = sorted(docs)
    for start in range(0, len(pairs) - batch_size + 1, batch_size):
        batch = pairs[start : start + batch_size]
        in_batch = {d for _, d in batch}
        others = rng.sample([d for d in doc_ids if d not in in_batch], batch_size)
        yield [q for q, _ in batch], [docs[d] for _, d in batch], [docs[d] for d in others]


@torch.no_grad()
def score(model, queries, positives, context_docs, temperature):
    kwargs = {}
    if is_contextual(model):
        kwargs["context_vectors"] = model.contextual_module.embed_context_texts(context_docs, batch_size=32)
    q = model.encode(queries, convert_to_tensor=True, normalize_embeddings=True, **kwargs)
    d = model.encode(positives, convert_to_tensor=True, normalize_embeddings=True, **kwargs)
    sims = q @ d.T
    target = torch.arange(len(queries))
    loss = torch.nn.functional.cross_entropy(sims / temperature, target).item()
    return (sims.argmax(1) == target).float().mean().item(), loss, sims.diag().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--data", default="../shared/data/retrieval/scifact", help="held-out BEIR folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch-size", type=int, default=64, help="B = J as in the mini preset")
    parser.add_argument("--max-seq-length", type=int, default=64, help="the training length")
    parser.add_argument("--temperature", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    batches = list(held_out_batches(args.data, args.split, args.batch_size, args.seed))
    print(f"{len(batches)} batches of {args.batch_size} held-out pairs from {args.data} ({args.split})\n")
    print("| model | context | top-1 acc | InfoNCE loss | mean cos(q, d+) |")
    print("|---|---|---|---|---|")
    for item in args.model:
        name, _, spec = item.partition("=")
        model = load_model(spec, args.max_seq_length)
        start = time.perf_counter()
        for label, pick in (("own", 1), ("other", 2)):
            rows = [score(model, b[0], b[1], b[pick], args.temperature) for b in batches]
            acc, loss, cos = (sum(r[i] for r in rows) / len(rows) for i in range(3))
            print(f"| {name} | {label} | {acc:.3f} | {loss:.3f} | {cos:.3f} |", flush=True)
        del model
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
