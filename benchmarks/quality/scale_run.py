"""The scale answer in one command: does the context help once MiniLM trains at batch = J = 512 on ~290k pairs?

    python benchmarks/quality/scale_run.py --data .gpu/b/data.tar.xz --model .gpu/minilm --out "$OUT"   # GPU
    python benchmarks/quality/scale_run.py --smoke --out /tmp/scale                                     # CPU, seconds

Trains two models from all-MiniLM-L6-v2 with the ``mini`` preset's recipe (cde_st/training/presets/mini.yaml) at the
paper's small setting: max length 64, batch = cluster = 512, clustered batches (the same for both: same data, seed
and sampler), false-negative filtering (guide: the same MiniLM), bf16, all pairs of ``--pairs``, up to
``--max-epochs`` passes over them:

- (d) the preset's contextual model with J = 512 context slots (the batch's documents are its context);
- (cp) the preset's bi-encoder (``model=biencoder``), trained and scored with the contextual model's prompts.

(d) trains first. Its learning rate follows transformers' linear schedule (warm-up over a tenth of an epoch, then a
linear decay to 0) whose length (d) sets during the warm-up, from the median of its first timed steps: as many steps
as fit its share of ``--budget-s``, at most ``--max-epochs`` epochs, so that the decay ends inside the lease instead
of being cut short. A wall-time guard still stops it should later steps be slower. (cp) then trains on the same
schedule and stops at the step (d) reached, so both see the same steps and pairs. ``--plan-steps`` fixes the length
instead (a second seed's run, with ``--stop-at-step``).

Then every model is scored on each BEIR folder of ``--corpora`` (default: SciFact, MED, CACM and LISA from
``--data``; any BEIR folders can be added) with NDCG@10 over the whole corpus (test split, max length 256,
the evaluation kit's prefixes, context sampling and identical-ids rule) by
:func:`cde_st.evaluation.ndcg.score_beir_folder`, which needs neither mteb, beir nor pytrec_eval: (a) zero-shot
MiniLM (the weights as carried), the same with the retrieval prompts, (cp), and (d) at J = 0, 64 and 512.

``--data`` is a folder or a ``.tar.xz`` of one (extracted to a temporary folder) holding ``pairs_wiki/`` and
``pairs/`` (training; the ``scifact_train`` domain is left out, as the preset does) and
``retrieval/{scifact,med,cacm,lisa}``. ``--model`` is an all-MiniLM-L6-v2 sentence-transformers folder; float16
weights (how it travels to the GPU machine) are widened to float32 in a temporary copy first.

Output in ``--out`` (default ``$OUT``): ``scale_run.json`` (every score, per-query NDCG, steps, pairs seen, wall
times, peak memory, the config) and ``scale_run.md`` (the table), rewritten after each stage so that a run stopped
from outside keeps what it finished; a short summary on stdout. ``--smoke``: a tiny random encoder, the built-in
tiny pairs and four generated BEIR folders, batch = J = 8, on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

CORPORA = ("scifact", "med", "cacm", "lisa")
# (d) plans its schedule's length at this step (or at the warm-up's end if sooner) from its last 20 steps' median
PLAN_AT_STEP = 31
FIXED_MTIME_NS = 1_700_000_000 * 10**9
logger = logging.getLogger("scale_run")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------------ inputs
def prepare_data(data: Path, work: Path) -> Path:
    if data.is_dir():
        return data
    target = work / "data"
    target.mkdir()
    with tarfile.open(data, "r:*") as archive:
        archive.extractall(target, filter="data")
    return target


def widen_model(folder: Path, work: Path) -> Path:
    """The MiniLM folder with float32 weights: a float16 copy (how it travels) is widened in a temporary copy."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    if all(t.dtype != torch.float16 for t in tensors.values()):
        return folder
    target = work / "minilm32"
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("model.safetensors"))
    save_file(
        {k: (v.float() if v.dtype == torch.float16 else v).contiguous() for k, v in tensors.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    # The clustering cache knows a surrogate folder by its path and its files' sizes and mtimes: fixed mtimes (and a
    # fixed --work) let the GPU run find a clustering computed here with --cluster-only and carried along.
    for file in target.rglob("*"):
        os.utime(file, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
    return target


def halve_model(folder: Path, work: Path) -> Path:
    """A copy of a model folder with float16 weights (how ``.gpu/minilm`` travels: benchmarks/gpu_prepare.sh)."""
    from safetensors.torch import load_file, save_file

    target = work / f"{folder.name}-fp16"
    shutil.copytree(folder, target)
    tensors = load_file(folder / "model.safetensors")
    save_file(
        {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    return target


def smoke_inputs(work: Path) -> tuple[Path, str]:
    """The tiny encoder, the built-in tiny pairs (as a jsonl folder) and four generated BEIR folders."""
    import gzip

    from cde_st.training.pairs import tiny_pairs
    from cde_st.training.tiny import build_tiny_encoder

    encoder = build_tiny_encoder(work / "tiny", num_layers=6)  # the preset reads the context in layers 3-5
    data = work / "smoke_data"
    (data / "pairs").mkdir(parents=True)
    with gzip.open(data / "pairs" / "tiny.jsonl.gz", "wt", encoding="utf-8") as f:
        for row in tiny_pairs():
            f.write(json.dumps(row) + "\n")
    topics = ["rain", "stocks", "proteins", "glaciers", "courts", "coffee", "music", "networks"]
    for c, name in enumerate(CORPORA):
        folder = data / "retrieval" / name
        (folder / "qrels").mkdir(parents=True)
        docs = [
            {"_id": str(i), "title": "", "text": f"a passage number {i} explaining {topics[(i + c) % 8]}"}
            for i in range(40)
        ]
        queries = [{"_id": str(100 + i), "text": f"question about {topics[(i + c) % 8]}"} for i in range(8)]
        (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
        qrels = "".join(f"{100 + i}\t{i + 8 * k}\t1\n" for i in range(8) for k in range(2))
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return data, encoder


# ------------------------------------------------------------------------------------------------ training
def make_config(args, model: str, base: str, pairs: list[str], output_dir: Path, max_steps: int, warmup: int):
    from cde_st.training import TrainConfig

    return TrainConfig.from_preset(
        "mini",
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


class LinearSchedule:
    """transformers' linear schedule (warm-up from 0, then a linear decay to 0 at ``total``) with ``total`` open to
    change: (d) plans it once its steps are timed. Changed during the warm-up, which does not depend on ``total``,
    it gives every step the learning rate it would have had with that ``total`` from the start."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return step / max(1, self.warmup)
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))


def planned_total(step: int, seconds_left: float, step_s: float, cap: int, margin: float = 0.9) -> int:
    """The schedule's length once ``step`` steps are done: the steps that fit in ``seconds_left`` at ``step_s`` a
    step (with a margin for slower steps later), at most ``cap``, never fewer than those done."""
    fit = step + int(margin * max(0.0, seconds_left) / step_s) if step_s > 0 else cap
    return max(step, min(cap, fit))


def guard_callback(deadline_from, stop_at: int | None, stop_reason: str, schedule: LinearSchedule, plan_at: int | None):
    """The trainer callback that times the steps, plans ``schedule``'s length at step ``plan_at`` and stops the
    training at the schedule's end, at ``stop_at`` or before the deadline (see :func:`train_one`)."""
    from transformers import TrainerCallback

    class Guard(TrainerCallback):
        def __init__(self) -> None:
            self.first_step_at: float | None = None
            self.deadline = float("inf")
            self.step_times: list[float] = []
            self.last = None
            self.stopped_by = "the schedule's end"  # until another stop; also the trainer's own max_steps
            self.plan: dict | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            now = time.monotonic()
            if self.first_step_at is None:
                self.first_step_at, self.deadline = now, deadline_from(now)
            self.last = now

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            self.step_times.append(now - self.last)
            # the first step carries one-off costs (CUDA context, kernel choice): later steps predict the next
            recent = self.step_times[1:][-20:] or self.step_times
            if plan_at is not None and state.global_step == plan_at:
                step_s = statistics.median(recent)
                cap = schedule.total
                schedule.total = planned_total(state.global_step, self.deadline - now, step_s, cap)
                self.plan = {
                    "at_step": plan_at,
                    "step_s": round(step_s, 4),
                    "seconds_left": round(self.deadline - now, 1),
                    "cap": cap,
                    "total": schedule.total,
                }
            if state.global_step >= schedule.total:
                control.should_training_stop, self.stopped_by = True, "the schedule's end"
            elif stop_at is not None and state.global_step >= stop_at:
                control.should_training_stop, self.stopped_by = True, f"{stop_reason} ({stop_at})"
            elif now + statistics.median(recent) > self.deadline:
                control.should_training_stop, self.stopped_by = True, "its wall-time share"

    return Guard()


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
    scores = {name: round(r["ndcg_at_k"], 2) for name, r in results.items()}
    return {"row": label, **scores, "mean": round(statistics.mean(scores.values()), 2) if scores else None}


@contextlib.contextmanager
def stage_of(report: dict, name: str):
    """Time a stage into ``report["stages_s"]``; an exception is recorded in ``report["errors"]``, not raised."""
    start = time.monotonic()
    try:
        yield
    except Exception:
        report.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
        log(f"{name} failed:\n{report['errors'][name]}")
    finally:
        report["stages_s"][name] = round(time.monotonic() - start, 1)


@contextlib.contextmanager
def work_folder(path: Path | None):
    """A temporary folder, or ``path`` emptied first (only a folder this script made, or an empty one)."""
    if path is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
        return
    marker = path / ".scale_run"
    if path.exists() and any(path.iterdir()) and not marker.exists():
        raise SystemExit(f"--work {path} holds files this script did not make: give an empty or new folder")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    marker.touch()
    yield path


def free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale_run.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    lines = [
        "# The scale run: (cp) vs (d) at batch = J = 512"
        + (" (smoke run: tiny sizes, numbers mean nothing)" if report["smoke"] else ""),
        "",
        f"Command: `{report['command']}`",
        "",
        f"Device: {report['device']}; torch {report['torch']}.",
        "",
        "| row | " + " | ".join(report["corpora"]) + f" | mean of {len(report['corpora'])} |",
        "|---|" + "---:|" * (len(report["corpora"]) + 1),
    ]
    for row in report["table"]:
        lines.append(
            f"| {row['row']} | " + " | ".join(f"{row.get(c, '')}" for c in report["corpora"]) + f" | {row['mean']} |"
        )
    lines += [
        "",
        "| model | steps | epochs | pairs seen | stopped by | learning rate at the stop (of its peak) | setup (s) "
        "| training (s) | first step (s) | later steps (s, median) | peak GPU memory (GiB) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, t in report["training"].items():
        lines.append(
            f"| {name} | {t['steps']} | {t.get('epochs')} | {t['pairs_seen']:,} of {t['pairs_available']:,} | "
            f"{t['stopped_by']} | {t['lr_factor_at_stop']} | {t['setup_s']} | {t['train_s']} | {t['first_step_s']} | "
            f"{t['step_s_median']} | {t['peak_memory_gib']} |"
        )
    if report.get("plan"):
        planned = (report["training"].get("(d)") or {}).get("schedule", {}).get("planned")
        lines += [
            "",
            "Schedule: "
            + json.dumps(report["plan"])
            + (f"; (d) planned it: {json.dumps(planned)}." if planned else "."),
        ]
    lines += [
        "",
        "Clustering: "
        + json.dumps({k: v for k, v in (report.get("clustering") or {}).items() if k != "batch_sizes"})
        + ".",
        "",
        f"Stages: {json.dumps(report['stages_s'])}; wall {report.get('wall_s')} s. Notes: "
        + "; ".join(report["notes"]),
    ]
    for name, error in report.get("errors", {}).items():
        lines += ["", f"Stage {name} failed: `{error.strip().splitlines()[-1]}` (traceback in scale_run.json)"]
    (out / "scale_run.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--data", type=Path, help="folder or .tar.xz with pairs_wiki/, pairs/, retrieval/")
    parser.add_argument("--model", type=Path, help="all-MiniLM-L6-v2 (sentence-transformers folder)")
    parser.add_argument(
        "--work", type=Path, help="working folder, emptied first (default: a temporary one); fixed for --cluster-only"
    )
    parser.add_argument(
        "--cluster-only",
        action="store_true",
        help="stop once the pairs are clustered into the cache ($CDE_ST_CACHE): prepares the GPU run on a CPU",
    )
    parser.add_argument(
        "--surrogate-kind",
        choices=("static", "transformer"),
        default="static",
        help="what embeds the pairs for clustering (MiniLM either way): 'static' (its model2vec distillation fitted "
        "to it) clusters the ~290k pairs on a 2-core CPU in minutes, where MiniLM itself takes hours there and "
        "152 s of an H100 lease",
    )
    parser.add_argument("--budget-s", type=float, default=400, help="the whole run, set-up and scoring included")
    parser.add_argument(
        "--eval-reserve-s", type=float, default=90, help="kept for scoring (d), (cp) and (a): 75 s on an H100"
    )
    parser.add_argument(
        "--d-share",
        type=float,
        default=0.55,
        help="(d)'s share of the training time left at its first step; (cp) needs the rest: its step costs 0.51x "
        "(d)'s on an H100 (first light, length 128, before the filter's guide adds the same to both)",
    )
    parser.add_argument(
        "--stop-at-step",
        type=int,
        help="(d) stops here at the latest (and (cp) with it): another seed's run trained to the same step",
    )
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=3,
        help="the longest schedule (d) may plan: after its first steps it plans as many steps as fit its time share",
    )
    parser.add_argument(
        "--plan-steps",
        type=int,
        help="the schedule's length, fixed (another seed's run: the length the first planned, with --stop-at-step)",
    )
    parser.add_argument(
        "--no-zero-shot",
        action="store_true",
        help="leave out the (a) rows, which do not depend on --seed (another seed's run: its time goes to training)",
    )
    parser.add_argument("--batch-size", type=int, default=512, help="batch = cluster")
    parser.add_argument("--context-size", type=int, default=512, help="J of (d)")
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--corpora", type=Path, nargs="+", help="BEIR folders to score (default: the four in --data's retrieval/)"
    )
    parser.add_argument(
        "--eval-sizes", type=int, nargs="+", help="J of (d) when scored (default 0 64 512; --smoke: 0 4 8)"
    )
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--logging-steps", type=int, default=20)
    args = parser.parse_args()
    if args.out is None:
        parser.error("--out is required when $OUT is not set")
    if not args.smoke and (args.data is None or args.model is None):
        parser.error("--data and --model are required without --smoke")
    if not args.smoke:
        args.eval_sizes = args.eval_sizes or [0, 64, 512]
    return args


def new_report(args: argparse.Namespace) -> dict:
    import torch

    return {
        "command": "python benchmarks/quality/scale_run.py " + " ".join(sys.argv[1:]),
        "smoke": args.smoke,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "stages_s": {},
        "training": {},
        "scores": {},
        "table": [],
        "corpora": [],
        "notes": [],
    }


def inputs(args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The data folder and the float32 base model; ``--smoke`` builds tiny ones and sends them through the real
    run's input path (a .tar.xz of the data, float16 weights widened back to float32)."""
    if not args.smoke:
        return prepare_data(args.data, work), str(widen_model(args.model, work))
    args.batch_size, args.context_size, args.eval_sizes = 8, 8, args.eval_sizes or [0, 4, 8]
    args.eval_batch_size, args.logging_steps = 16, 2
    folder, encoder = smoke_inputs(work)
    archive = work / "smoke_data.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for part in folder.iterdir():
            tar.add(part, arcname=part.name)
    return prepare_data(archive, work), str(widen_model(halve_model(Path(encoder), work), work))


def cluster_stage(args, report: dict, base: str, pairs: list[str], train_pairs, work: Path) -> None:
    """The clustering both trainings will load, as its own stage (into ``report["clustering"]``)."""
    probe = make_config(args, "contextual", base, pairs, work / "probe", -1, 0)
    with stage_of(report, "cluster"):  # the sampler's options do not depend on the model
        report["clustering"] = cluster(probe, train_pairs, args.max_epochs)
    if "clustering" not in report and args.surrogate_kind == "static" and not args.cluster_only:
        # not found in the cache, and the static surrogate could not be made here (model2vec's distillation needs
        # extras a GPU machine may lack): MiniLM itself clusters, slower, rather than no run at all
        report["notes"].append("the static surrogate's clustering failed (errors: cluster); MiniLM clustered")
        args.surrogate_kind = "transformer"
        probe = make_config(args, "contextual", base, pairs, work / "probe", -1, 0)
        with stage_of(report, "cluster_transformer"):
            report["clustering"] = cluster(probe, train_pairs, args.max_epochs)
    if "clustering" in report:
        log("clustering: " + json.dumps({k: v for k, v in report["clustering"].items() if k != "batch_sizes"}))


def plan(args, report: dict, n_pairs: int) -> tuple[int, list[int], int, int]:
    """One epoch's steps, the batch sizes epoch after epoch, the warm-up and the longest schedule (into
    ``report["plan"]``)."""
    # the sampler's batches, epoch after epoch (a cluster's remainder is a smaller batch of its own)
    epoch_steps = report.get("clustering", {}).get("batches") or -(-n_pairs // args.batch_size)
    batch_sizes = report.get("clustering", {}).get("batch_sizes") or [args.batch_size] * epoch_steps * args.max_epochs
    # the warm-up is a share of one epoch, whatever the schedule's length: (d) plans that length within it
    warmup = max(1, round(args.warmup_fraction * epoch_steps))
    cap = args.plan_steps or args.max_epochs * epoch_steps
    if cap > len(batch_sizes):
        raise SystemExit(
            f"--plan-steps {cap} is more than --max-epochs {args.max_epochs} epochs ({len(batch_sizes)} steps): "
            "raise --max-epochs"
        )
    report["plan"] = {
        "pairs": n_pairs,
        "epoch_steps": epoch_steps,
        "warmup_steps": warmup,
        "planned_steps": cap,
        "planned_by": "--plan-steps" if args.plan_steps else f"(d)'s step time, at most {args.max_epochs} epochs",
    }
    log(f"{n_pairs} pairs, {epoch_steps} steps an epoch, warm-up {warmup}: {report['plan']['planned_by']}")
    return epoch_steps, batch_sizes, warmup, cap


def score_zero_shot(args, report: dict, base: str, corpora: dict[str, Path]) -> None:
    """The (a) rows: MiniLM as carried, without and with the retrieval prompts."""
    import torch

    with stage_of(report, "score_a"):
        from sentence_transformers import SentenceTransformer

        zero_shot = SentenceTransformer(base, device="cuda" if torch.cuda.is_available() else "cpu")
        report["scores"]["(a) zero-shot"] = score(zero_shot, corpora, None, args.eval_batch_size)
        # the trained rows start from here, not from (a): MiniLM never saw these prompts, which cost it points
        report["scores"]["(a) with the prompts"] = score(zero_shot, corpora, None, args.eval_batch_size, prefixes=True)


def train_and_score(args, report: dict, base: str, pairs: list[str], train_pairs, work: Path, deadline: float):
    """(d), then (cp) stopped at (d)'s step, then the zero-shot rows; ``report`` is rewritten after each stage. A
    stage that fails is recorded and the run goes on, so that one call still returns every number it could measure."""
    epoch_steps, batch_sizes, warmup, cap = plan(args, report, len(train_pairs))
    corpora = {name: Path(folder) for name, folder in report["corpus_folders"].items()}

    # (d) first: it sets the step count both models share. At its first step its set-up is known: (cp)'s is taken
    # to be the same, and what is left after both set-ups and the scoring reserve is shared.
    cfg_d = make_config(args, "contextual", base, pairs, work / "d", cap, warmup)
    schedule = LinearSchedule(warmup, cap)
    report["config_d"] = cfg_d.to_dict()
    d_started = time.monotonic()

    def d_deadline(first_step_at: float) -> float:
        setup = first_step_at - d_started
        return first_step_at + args.d_share * (deadline - first_step_at - setup - args.eval_reserve_s)

    steps, per_scoring = None, args.eval_reserve_s / 6
    with stage_of(report, "train_d"):
        model_d, report["training"]["(d)"] = train_one(
            cfg_d,
            train_pairs,
            batch_sizes,
            d_deadline,
            args.stop_at_step,
            schedule,
            plan_at=None if args.plan_steps else min(PLAN_AT_STEP, warmup),
            stop_reason="--stop-at-step",
        )
        steps = report["training"]["(d)"]["steps"]
        report["training"]["(d)"]["epochs"] = round(steps / epoch_steps, 2)
        log(f"(d) trained: {report['training']['(d)']}")
    write(args.out, report)
    if "(d)" in report["training"]:
        with stage_of(report, "score_d"):
            for j in args.eval_sizes:
                results = score(model_d, corpora, j, args.eval_batch_size)
                report["scores"][f"(d) J={j}"] = results
                log(f"(d) J={j}: " + ", ".join(f"{k} {v['ndcg_at_k']:.2f}" for k, v in results.items()))
        per_scoring = report["stages_s"]["score_d"] / len(args.eval_sizes)
        del model_d
    free()
    write(args.out, report)

    # (cp): the same schedule, stopped at (d)'s step; its scoring and (a)'s kept in reserve
    cp_deadline = deadline - 2.5 * per_scoring
    report["plan"]["planned_steps"] = schedule.total
    cfg_cp = make_config(args, "biencoder", base, pairs, work / "cp", schedule.total, warmup)
    report["config_cp"] = cfg_cp.to_dict()
    with stage_of(report, "train_cp"):
        model_cp, report["training"]["(cp)"] = train_one(
            cfg_cp, train_pairs, batch_sizes, lambda _: cp_deadline, steps, LinearSchedule(warmup, schedule.total)
        )
        report["training"]["(cp)"]["epochs"] = round(report["training"]["(cp)"]["steps"] / epoch_steps, 2)
        log(f"(cp) trained: {report['training']['(cp)']}")
        if report["training"]["(cp)"]["steps"] != steps:
            report["notes"].append(
                f"(cp) stopped at {report['training']['(cp)']['steps']} steps, (d) at {steps}: not the same step count"
            )
    write(args.out, report)
    if "(cp)" in report["training"]:
        with stage_of(report, "score_cp"):
            report["scores"]["(cp)"] = score(model_cp, corpora, None, args.eval_batch_size, prefixes=True)
        del model_cp
    free()
    if not args.no_zero_shot:
        score_zero_shot(args, report, base, corpora)
    order = ["(a) zero-shot", "(a) with the prompts", "(cp)", *(f"(d) J={j}" for j in args.eval_sizes)]
    report["table"] = [row_of(name, report["scores"][name]) for name in order if name in report["scores"]]


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("cde_st").setLevel(logging.INFO)
    import torch

    args.bf16 = bool(torch.cuda.is_available() and not args.smoke)
    report = new_report(args)
    with work_folder(args.work) as work:
        data, base = inputs(args, work)
        pairs = [str(p) for p in (data / "pairs_wiki", data / "pairs") if p.is_dir()]
        folders = args.corpora or [data / "retrieval" / name for name in CORPORA]
        report["corpus_folders"] = {Path(folder).name: str(folder) for folder in folders}
        report["corpora"] = list(report["corpus_folders"])
        report["stages_s"]["inputs"] = round(time.monotonic() - started, 1)
        log(f"inputs ready: pairs {pairs}, base {base}")
        from cde_st.training.pairs import load_pairs

        # the same pairs for both models (same data fields)
        train_pairs = load_pairs(make_config(args, "contextual", base, pairs, work / "probe", -1, 0))
        cluster_stage(args, report, base, pairs, train_pairs, work)
        write(args.out, report)
        if args.cluster_only:
            return
        train_and_score(args, report, base, pairs, train_pairs, work, started + args.budget_s)
        report["wall_s"] = round(time.monotonic() - started, 1)
        write(args.out, report)
    print((args.out / "scale_run.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
