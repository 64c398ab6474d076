"""Training and scoring of the scale run's models: the trainer's own pieces (cde_st.training.run) with the
learning-rate schedule and guard of :mod:`time_budget`, the pairs clustered once for both models, and NDCG@10 on
BEIR folders without mteb."""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

from time_budget import LinearSchedule, guard_callback

__all__ = ["batch_sampler", "cluster", "make_config", "row_of", "score", "train_one"]


def make_config(args, model: str, base: str, pairs: list[str], output_dir: Path, max_steps: int, warmup: int):
    """The ``mini`` preset at the run's sizes, for ``model`` (contextual or biencoder) from ``base``; the contextual
    model pools as ``args.pooling`` says (``context``: the pooling that learned the corpus-statistics benchmark)."""
    from cde_st.training import TrainConfig

    contextual = {}
    if model == "contextual":
        contextual["model_config"] = {**TrainConfig.from_preset("mini").model_config, "pooling": args.pooling}
    return TrainConfig.from_preset(
        "mini",
        **contextual,
        model=model,
        base_model=base,
        surrogate=base,
        guide=base,
        surrogate_kind=args.surrogate_kind,
        train_data=pairs,
        max_pairs=None,
        context_size=args.context_size,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        cluster_size=args.batch_size,
        filter_false_negatives=True,
        bf16=args.bf16,
        seed=args.seed,
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=10**9,  # no checkpoint: the models are scored in memory and cannot travel back anyway
        logging_steps=args.logging_steps,
        output_dir=str(output_dir),
    )


def train_one(
    cfg,
    pairs,
    batch_sizes: list[int],
    deadline_from,
    stop_at: int | None,
    schedule: LinearSchedule,
    plan_at: int | None = None,
    stop_reason: str = "the step (d) reached",
) -> tuple[object, dict]:
    """Train as cde_st's ``train()`` does (same model, loss, optimizer, batches, arguments) with ``schedule`` for
    the learning rate and a callback that stops at the schedule's end, at ``stop_at`` steps or when the deadline
    passes, whichever comes first. ``deadline_from(t)`` gives that deadline (time.monotonic) from the time ``t`` of
    the first step: the set-up before it is measured, not guessed. With ``plan_at``, the schedule's length is set
    at that step (within the warm-up) to the steps that fit before the deadline at the median step time so far."""
    import torch
    from torch.optim.lr_scheduler import LambdaLR

    from cde_st.training.run import (
        MainProcessSavingTrainer,
        build_loss,
        build_model,
        build_optimizer,
        training_arguments,
    )

    guard = guard_callback(deadline_from, stop_at, stop_reason, schedule, plan_at)
    torch.manual_seed(cfg.seed)
    start = time.monotonic()
    model = build_model(cfg)
    loss = build_loss(cfg, model)
    sampler = batch_sampler(cfg, pairs)
    args = training_arguments(cfg, pairs, None, batch_sampler=sampler, save_strategy="no")
    optimizer = build_optimizer(cfg, model)
    trainer = MainProcessSavingTrainer(
        model=model,
        args=args,
        train_dataset=pairs.remove_columns("domain"),
        loss=loss,
        optimizers=(optimizer, LambdaLR(optimizer, schedule.factor)),
        callbacks=[guard],
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    end = time.monotonic()
    steps = trainer.state.global_step
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    info = {
        "steps": steps,
        "pairs_seen": sum(batch_sizes[:steps]),
        "pairs_available": len(pairs),
        "stopped_by": guard.stopped_by,
        "schedule": {"warmup_steps": schedule.warmup, "total_steps": schedule.total, "planned": guard.plan},
        # 0 where the schedule ran to its end; above 0 where a stop cut its decay short
        "lr_factor_at_stop": round(schedule.factor(steps), 4),
        "setup_s": round((guard.first_step_at or end) - start, 1),  # data, model, surrogate embedding, k-means
        "train_s": round(end - (guard.first_step_at or end), 1),
        "first_step_s": round(guard.step_times[0], 4) if guard.step_times else None,
        "step_s_median": round(statistics.median(guard.step_times[1:] or guard.step_times), 4)
        if guard.step_times
        else None,  # the first step left out where there are others
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "loss_first_logged": losses[0] if losses else None,
        "loss_last_logged": losses[-1] if losses else None,
    }
    model.eval()
    return model, info


def batch_sampler(cfg, pairs):
    """The trainer's batch sampler (the library's, options bound), both models get the same, hence the same batches.
    The surrogate embeds ~580k texts on a cache miss: larger encoding batches than the sampler's default 64."""
    from cde_st.training.run import build_batch_sampler

    sampler = build_batch_sampler(cfg, pairs)
    return functools.partial(sampler, encode_batch_size=1024) if isinstance(sampler, functools.partial) else sampler


def cluster(cfg, pairs, epochs: int) -> dict:
    """Cluster the pairs as the trainer's sampler will (same options, same seed), so that both trainings load the
    clustering from the cache and their set-up times hold no embedding or k-means. Says whether it was cached, and
    the batch sizes of ``epochs`` epochs in the order both trainings see them (each epoch reorders the batches)."""
    from cde_st.batching.cache import default_cache_dir

    before = set(default_cache_dir().glob("clusters-*.npz")) if default_cache_dir().is_dir() else set()
    sampler = batch_sampler(cfg, pairs)(
        pairs.remove_columns("domain"), batch_size=cfg.batch_size, drop_last=False, seed=cfg.seed
    )
    path = getattr(sampler, "cache_path", None)
    sizes = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # as the trainer does before each epoch
        sizes += [len(batch) for batch in sampler]
    return {
        "batches": len(sampler),  # one epoch's
        "batch_sizes": sizes,
        "cache_file": None if path is None else Path(path).name,
        "loaded_from_cache": path is not None and Path(path) in before,
        "timings_s": {k: round(v, 1) for k, v in (getattr(sampler, "timings", None) or {}).items()},
    }


# ------------------------------------------------------------------------------------------------ scoring
def score(model, corpora: dict[str, Path], context_size: int | None, batch_size: int, prefixes=None) -> dict:
    """NDCG@10 on each corpus in float32 (as the kit scores on the CPU: the first GPU run measures how far float32
    on the GPU is from the CPU)."""
    from cde_st.evaluation.ndcg import score_beir_folder

    model.max_seq_length = 256
    return {
        name: score_beir_folder(model, folder, context_size=context_size, batch_size=batch_size, prefixes=prefixes)
        for name, folder in corpora.items()
    }


def row_of(label: str, results: dict) -> dict:
    """A table row: NDCG@10 per corpus (two decimals) and their mean."""
    scores = {name: round(r["ndcg_at_k"], 2) for name, r in results.items()}
    return {"row": label, **scores, "mean": round(statistics.mean(scores.values()), 2) if scores else None}
