"""The scale answer in one command: does the context help once MiniLM trains at batch = J = 512 on ~290k pairs?

    python benchmarks/quality/scale_run.py --data .gpu/data/scale_data.tar.xz --model .gpu/minilm --out "$OUT"   # GPU
    python benchmarks/quality/scale_run.py --smoke --out /tmp/scale                                     # CPU, seconds

Trains two models from all-MiniLM-L6-v2 with the ``mini`` preset's recipe (cde_st/training/presets/mini.yaml) at the
paper's small setting: max length 64, batch = cluster = 512, clustered batches (the same for both: same data, seed
and sampler), false-negative filtering (guide: the same MiniLM), bf16, all pairs of ``--pairs``, up to
``--max-epochs`` passes over them:

- (d) the preset's contextual model with J = 512 context slots (the batch's documents are its context);
- (cp) the preset's bi-encoder (``model=biencoder``), trained and scored with the contextual model's prompts.

(d) trains first. Its learning rate follows transformers' linear schedule (warm-up over a tenth of an epoch, then a
linear decay to 0) whose length (d) sets during the warm-up, from the median of its first timed steps: as many steps
as fit its share of ``--budget-s``, at most ``--max-epochs`` epochs, so that the decay ends inside the run's time
instead of being cut short. A wall-time guard still stops it should later steps be slower. (cp) then trains on the same
schedule and stops at the step (d) reached, so both see the same steps and pairs. ``--plan-steps`` fixes the length
instead (a second seed's run, with ``--stop-at-step``).

Then every model is scored on each BEIR folder of ``--corpora`` (default: SciFact, MED, CACM and LISA from
``--data``; any BEIR folders can be added) with NDCG@10 over the whole corpus (test split, max length 256,
the evaluation kit's prefixes, context sampling and identical-ids rule) by
:func:`cde_st.evaluation.ndcg.score_beir_folder`, which needs neither mteb, beir nor pytrec_eval: (a) zero-shot
MiniLM (the weights as packed), the same with the retrieval prompts, (cp), and (d) at J = 0, 64 and 512.

``--data`` is a folder or a ``.tar.xz`` of one (extracted to a temporary folder) holding ``pairs_wiki/`` and
``pairs/`` (training; the ``scifact_train`` domain is left out, as the preset does) and
``retrieval/{scifact,med,cacm,lisa}``. ``--model`` is an all-MiniLM-L6-v2 sentence-transformers folder; float16
weights (as packed for the GPU machine) are widened to float32 in a temporary copy first.

Output in ``--out`` (default ``$OUT``): ``scale_run.json`` (every score, per-query NDCG, steps, pairs seen, wall
times, peak memory, the config) and ``scale_run.md`` (the table), rewritten after each stage so that a run stopped
from outside keeps what it finished; a short summary on stdout. ``--smoke``: a tiny random encoder, the built-in
tiny pairs and four generated BEIR folders, batch = J = 8, on the CPU.
"""

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder's modules and the shared benchmarks/harness.py

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from harness import command_line, environment, free_memory, log, write_json  # noqa: E402
from scale_inputs import CORPORA, run_inputs  # noqa: E402
from scale_training import cluster, make_config, row_of, score, train_one  # noqa: E402
from time_budget import LinearSchedule  # noqa: E402

# (d) plans its schedule's length at this step (or at the warm-up's end if sooner) from its last 20 steps' median
PLAN_AT_STEP = 31


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


def write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "scale_run.json", report)
    lines = [
        "# The scale run: (cp) vs (d) at batch = J = 512"
        + (" (smoke run: tiny sizes, numbers mean nothing)" if report["smoke"] else ""),
        "",
        f"Command: `{report['command']}`",
        "",
        "Environment: " + "; ".join(f"{k} {v}" for k, v in report["environment"].items()) + ".",
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


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """The run's time budget and how (d) and (cp) share it: the schedule's length, where to stop, the reserve."""
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
        "152 s of an H100",
    )
    add_schedule_arguments(parser)
    pooling = "(d)'s pooling: mean (the preset) or context (a token's weight from its corpus: what learned the corpus-"
    parser.add_argument(
        "--pooling", choices=["context", "mean"], default="context", help=pooling + "statistics benchmark)"
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
        "command": command_line(),
        "smoke": args.smoke,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment("cuda" if torch.cuda.is_available() else "cpu"),
        "stages_s": {},
        "training": {},
        "scores": {},
        "table": [],
        "corpora": [],
        "notes": [],
    }


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
    """The (a) rows: MiniLM as packed, without and with the retrieval prompts."""
    import torch

    with stage_of(report, "score_a"):
        from sentence_transformers import SentenceTransformer

        zero_shot = SentenceTransformer(base, device="cuda" if torch.cuda.is_available() else "cpu")
        report["scores"]["(a) zero-shot"] = score(zero_shot, corpora, None, args.eval_batch_size)
        # the trained rows start from here, not from (a): MiniLM never saw these prompts, which cost it points
        report["scores"]["(a) with the prompts"] = score(zero_shot, corpora, None, args.eval_batch_size, prefixes=True)


def score_d(args, report: dict, model_d, corpora: dict[str, Path]) -> float:
    """The (d) rows, one per J of ``--eval-sizes``; the seconds one of them took (to size the reserve of the rest)."""
    with stage_of(report, "score_d"):
        for j in args.eval_sizes:
            results = score(model_d, corpora, j, args.eval_batch_size)
            report["scores"][f"(d) J={j}"] = results
            log(f"(d) J={j}: " + ", ".join(f"{k} {v['ndcg_at_k']:.2f}" for k, v in results.items()))
    return report["stages_s"]["score_d"] / len(args.eval_sizes)


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
        from cde_st.model import contextual_module

        pool = getattr(contextual_module(model_d), "pool", None)
        if hasattr(pool, "strength"):  # pooling=context: how far the pool's one weight moved from zero
            report["training"]["(d)"]["pool_strength"] = round(float(pool.strength), 4)
        log(f"(d) trained: {report['training']['(d)']}")
    write(args.out, report)
    if "(d)" in report["training"]:
        per_scoring = score_d(args, report, model_d, corpora)
        del model_d
    free_memory()
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
    free_memory()
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
        data, base = run_inputs(args, work)
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
