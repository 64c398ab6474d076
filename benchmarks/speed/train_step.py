"""One training step's time and peak memory, and the clustered sampler's k-means time: what ``bench_gpu.py``,
``bench_loss.py`` and ``gpu_first_light.py`` measure.

A step is FilteredInfoNCELoss forward + backward + AdamW on ready (query, document) feature columns. Step time: the
median of the timed steps after the warm-up steps. Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over
the timed steps (weights, optimizer state and batch included); on a CPU the peak RSS above the RSS after warm-up
(sampled every millisecond by :class:`peak_rss.PeakRSS`), i.e. the step's transient memory.
"""

from __future__ import annotations

import contextlib
import gc
import statistics

from harness import free_memory, timed_calls, warm_up
from peak_rss import PeakRSS

__all__ = ["feature_columns", "measure_kmeans", "measure_step", "optimizer_step", "time_steps"]


def feature_columns(tokenizer, prompts: list[str], batch: int, length: int, device, seed: int) -> list[dict]:
    """(B, L) features per column: [CLS] prompt random-ids [SEP], no padding (the collator's format)."""
    import torch

    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    low = max(tokenizer.all_special_ids) + 1  # ordinary tokens only
    generator = torch.Generator().manual_seed(seed)
    columns = []
    for prompt in prompts:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        body = length - 2 - len(prompt_ids)
        if body < 1:
            raise ValueError(f"--length {length} leaves no room for text after the prompt {prompt!r}.")
        ids = torch.randint(low, len(tokenizer), (batch, length), generator=generator)
        ids[:, 0], ids[:, -1] = cls_id, sep_id
        ids[:, 1 : 1 + len(prompt_ids)] = torch.tensor(prompt_ids)
        columns.append(
            {
                "input_ids": ids.to(device),
                "attention_mask": torch.ones_like(ids).to(device),
                "token_type_ids": torch.zeros_like(ids).to(device),
            }
        )
    return columns


def _build_model(cfg: dict, spec: dict):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from cde_st import ContextualSentenceTransformer

    if spec["model"] == "contextual":
        return ContextualSentenceTransformer.from_encoder(
            cfg["encoder"],
            context_size=cfg["context_size"],
            max_seq_length=cfg["length"],
            attn_implementation=spec["attn"],
        )
    transformer = Transformer(
        cfg["encoder"], max_seq_length=cfg["length"], model_kwargs={"attn_implementation": spec["attn"]}
    )
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


def measure_step(cfg: dict, spec: dict) -> dict:
    """Step time and peak memory of one configuration (see the module docstring); running out of memory is a
    result too."""
    import torch

    try:
        return {**spec, "status": "ok", **_timed_steps(cfg, spec)}
    except torch.OutOfMemoryError as exc:
        return {**spec, "status": "out of memory", "detail": str(exc).split("\n")[0][:200]}
    finally:  # the model, its gradients and optimizer state went with _timed_steps' frame
        free_memory()


def _timed_steps(cfg: dict, spec: dict) -> dict:
    import torch

    from cde_st.losses import FilteredInfoNCELoss

    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    model = _build_model(cfg, spec).to(device)
    model.train()
    mini = cfg["mini_batch_size"] if spec["cached"] else None
    loss = FilteredInfoNCELoss(model, guide=False, mini_batch_size=mini)
    prompts = [model.prompts.get("query", "search_query: "), model.prompts.get("document", "search_document: ")]
    columns = feature_columns(model.tokenizer, prompts, cfg["batch_size"], cfg["length"], device, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=spec["bf16"])

    return time_steps(optimizer_step(loss, optimizer, columns, autocast), cfg["warmup"], cfg["steps"], device)


def optimizer_step(loss, optimizer, columns: list[dict], autocast=None):
    """One training step as a function: zero the gradients, the loss on ``columns`` forward and backward (under
    ``autocast`` when given: the backward replays both stages with gradient caching, so it stays inside), AdamW's
    update; it returns the loss value (which waits for the device)."""

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast or contextlib.nullcontext():
            value = loss([dict(c) for c in columns], None)
            value.backward()
        optimizer.step()
        return value.item()

    return step


def time_steps(step, warmup: int, steps: int, device) -> dict:
    """Median seconds of ``steps`` calls of ``step`` after ``warmup`` untimed ones, and the peak memory over the
    timed calls (see the module docstring: device memory on CUDA, the RSS above its level after warm-up on a CPU)."""
    import torch

    device = torch.device(device)
    cuda = device.type == "cuda"
    warm_up(step, warmup, device=device)
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    meter = contextlib.nullcontext() if cuda else PeakRSS()
    baseline = 0 if cuda else meter.peak
    with meter:
        times, value = timed_calls(step, steps, device=device)
    peak = torch.cuda.max_memory_allocated(device) if cuda else meter.peak - baseline
    return {
        "step_s": statistics.median(times),
        "peak_mib": peak / 2**20,
        "baseline_mib": baseline / 2**20,
        "loss": value,
    }


def measure_kmeans(cfg: dict, spec: dict) -> dict:
    """Wall time of cluster_pairs on synthetic unit vectors, faiss on CPU or GPU."""
    import faiss
    import numpy as np

    from cde_st.batching.clustering import cluster_pairs

    rng = np.random.default_rng(0)
    n, dim = cfg["kmeans_pairs"], cfg["kmeans_dim"]
    q = rng.standard_normal((n, dim), dtype=np.float32)
    d = rng.standard_normal((n, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    (seconds,), clustering = timed_calls(
        lambda: cluster_pairs(q, d, cluster_size=cfg["kmeans_cluster_size"], seed=0, use_gpu=spec["use_gpu"])
    )
    return {
        **spec,
        "status": "ok",
        "seconds": seconds,
        "k": clustering.num_clusters,
        "threads": faiss.omp_get_max_threads(),
    }
