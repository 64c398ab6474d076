"""Console entry points: ``cde-st-train``, ``cde-st-eval`` and ``cde-st-convert``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as TrainConfig fields: values read as YAML, then checked and coerced against the
    field types (a :class:`~cde_st.training.TrainConfigError` names the item, the field and the expected type)."""
    import yaml

    from cde_st.training import TrainConfig, TrainConfigError

    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise TrainConfigError(f"--set expects KEY=VALUE, got {item!r}.")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise TrainConfigError(f"--set {item}: cannot read the value: {err}") from None
        overrides.update(TrainConfig.check_values({key.strip(): parsed}, f"--set {item}"))
    return overrides


def train_main(argv: list[str] | None = None) -> None:
    """Train a contextual model (or a bi-encoder baseline) from a preset and/or a YAML/JSON config."""
    from cde_st import training
    from cde_st.training import PRESETS, OutputDirError, TrainConfig, TrainConfigError

    parser = argparse.ArgumentParser(
        prog="cde-st-train",
        description="Train a contextual document embedding model with SentenceTransformerTrainer.",
        epilog="Example: cde-st-train --preset mini --set model=biencoder batching=random --output-dir runs/b",
    )
    parser.add_argument("--config", help="YAML or JSON file with TrainConfig fields (may name a `preset:`)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument("--output-dir", help="where checkpoints and the final model go")
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        help="resume from the last checkpoint in output-dir (or from the given checkpoint)",
    )
    parser.add_argument(
        "--overwrite-output-dir",
        action="store_true",
        help="replace an earlier run in output-dir (its checkpoints, final model, summary and config are removed)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue although the config differs from the one the checkpoints were trained with",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        overrides = _parse_overrides(args.set)
        if args.output_dir:
            overrides["output_dir"] = args.output_dir
        values = TrainConfig.read_file(args.config) if args.config else {}
        preset = args.preset or values.pop("preset", None)
        values.pop("preset", None)
        values.update(overrides)
        cfg = TrainConfig.from_preset(preset, **values) if preset else TrainConfig.from_dict(values)
    except (TrainConfigError, FileNotFoundError) as err:
        parser.error(str(err))
    try:
        training.train(
            cfg,
            resume=args.resume,
            overwrite_output_dir=args.overwrite_output_dir,
            allow_config_change=args.allow_config_change,
        )
    except (OutputDirError, training.ResumeConfigError) as err:
        parser.error(str(err))


EVAL_DESCRIPTION = r"""Evaluate a CDE (or any sentence-transformers) model on MTEB tasks with per-task corpus context.

    python eval/run_mteb.py --model PATH_OR_NAME --tasks scifact stsbenchmark --data-dir ../shared/data
    python eval/run_mteb.py --model my-cde --tasks scifact --data-dir ../shared/data --context-size 0 16 64 256
    python eval/run_mteb.py --model my-cde --tasks scifact --data-dir ../shared/data --context random \
        --random-corpus classification/tweet_sentiment_extraction

Tasks are mteb task names (data from the Hugging Face hub) or local folders in the formats of ../shared/data (a
path, or a folder name found under --data-dir). Results: mteb JSON under OUTPUT_DIR/results/, summary tables
(Markdown + CSV; per task and per task type as in the CDE paper's Table 2) under OUTPUT_DIR/summary/, and for
several --context-size values a sweep table and plot. All logic lives in cde_st.evaluation.
"""


def _eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cde-st-eval", description=EVAL_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="model folder or hub id")
    parser.add_argument("--tasks", nargs="+", required=True, help="mteb task names, local folders or local names")
    parser.add_argument("--data-dir", help="root of local task folders (e.g. ../shared/data)")
    parser.add_argument("--context-size", type=int, nargs="+", help="J (several: a sweep); default: the model's")
    parser.add_argument("--context-seed", type=int, default=0, help="seed of the context sampling (default 0)")
    parser.add_argument(
        "--context",
        choices=["corpus", "random", "none"],
        default="corpus",
        help="corpus: the task's own pool; random: another corpus; none: null context",
    )
    parser.add_argument(
        "--random-corpus",
        help="fixed corpus for --context random (task, folder, .txt/.jsonl); default: the other tasks' pools",
    )
    parser.add_argument(
        "--prefixes",
        choices=["auto", "on", "off"],
        default="auto",
        help="task prefixes (auto: on for contextual models, off for plain ones)",
    )
    parser.add_argument(
        "--prefix",
        action="append",
        default=[],
        metavar="ROLE=TEXT",
        help="override a prefix: query, document, classification, clustering, symmetric",
    )
    parser.add_argument("--output-dir", default="mteb_results", help="results folder (default: mteb_results)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-splits", nargs="+", help="evaluate these splits instead of the task defaults")
    parser.add_argument("--model-name", help="model name in results (org/name)")
    parser.add_argument("--revision", help="model revision in results (default: hash of the weights)")
    parser.add_argument(
        "--no-overwrite",
        action="store_true",
        help="reuse results in --output-dir computed on the same data with the same context and settings "
        "(any other cached result re-runs, with a warning that says why)",
    )
    parser.add_argument(
        "--identical-ids",
        choices=["auto", "ignore", "keep"],
        default="auto",
        help="retrieval: may a query retrieve a corpus document with its own id? auto: the mteb task's setting "
        "(also for local folders named after an mteb task), else ignore only when the queries are corpus documents "
        "(decided from the texts; ids that merely coincide are kept); the rule used and why are printed",
    )
    parser.add_argument("--device", help="torch device (default: sentence-transformers' choice)")
    parser.add_argument("--max-seq-length", type=int, help="token limit of the inputs (default: the model's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def eval_run(argv: list[str] | None = None) -> int:
    """Run ``cde-st-eval`` / ``python eval/run_mteb.py`` on ``argv``; returns the exit status."""
    args = _eval_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("mteb", "datasets", "httpx", "urllib3", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from cde_st.evaluation.local_tasks import LocalDataError
    from cde_st.evaluation.runner import TaskDataError, UnknownTaskError, evaluate_model

    overrides = {}
    for item in args.prefix:
        role, sep, text = item.partition("=")
        if not sep:
            print(f"error: --prefix expects ROLE=TEXT, got {item!r}", file=sys.stderr)
            return 2
        overrides[role] = text
    prefixes = {"auto": None, "on": True, "off": False}[args.prefixes]
    try:
        report = evaluate_model(
            args.model,
            args.tasks,
            data_dir=args.data_dir,
            context_size=args.context_size,
            context_seed=args.context_seed,
            context=args.context,
            random_corpus=args.random_corpus,
            prefixes=prefixes,
            prefix_overrides=overrides or None,
            output_dir=args.output_dir,
            batch_size=args.batch_size,
            model_name=args.model_name,
            revision=args.revision,
            eval_splits=args.eval_splits,
            overwrite=not args.no_overwrite,
            show_progress_bar=not args.quiet,
            device=args.device,
            max_seq_length=args.max_seq_length,
            identical_ids=args.identical_ids,
        )
    except (UnknownTaskError, LocalDataError, TaskDataError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    for kind, path in sorted(report.files.items()):
        print(f"{kind}: {Path(path)}")
    return 0


def eval_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-eval`` (same as ``python eval/run_mteb.py``)."""
    sys.exit(eval_run(argv))


def convert_run(argv: list[str] | None = None) -> int:
    """Write a released CDE checkpoint (cde-small-v1/v2, hub id, short name or local copy) as a native cde_st
    folder, which then loads offline with ``ContextualSentenceTransformer(DST)``: no remote code, no network."""
    parser = argparse.ArgumentParser(
        prog="cde-st-convert",
        description=convert_run.__doc__,
        epilog="Example: cde-st-convert jxm/cde-small-v2 models/cde-small-v2",
    )
    parser.add_argument(
        "src", help="jxm/cde-small-v2, jxm/cde-small-v1, cde-small, or a folder with the released files"
    )
    parser.add_argument("dst", help="output folder (must not exist, or be empty)")
    parser.add_argument("--backbone-config", help="the backbone's config.json (default: beside SRC, else the hub)")
    parser.add_argument("--tokenizer", help="tokenizer folder or name (default: beside SRC, else the backbone's)")
    parser.add_argument("--revision", help="hub revision of SRC")
    args = parser.parse_args(argv)

    from cde_st.model import ContextualSentenceTransformer
    from cde_st.released import ReleasedCheckpointError, is_released_checkpoint

    dst = Path(args.dst).expanduser()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        print(f"error: {dst} exists and is not empty; choose a new folder.", file=sys.stderr)
        return 2
    if not is_released_checkpoint(args.src, revision=args.revision):
        print(
            f"error: {args.src!r} is not a released CDE checkpoint (no config.json with the CDE fields).",
            file=sys.stderr,
        )
        return 2
    try:
        model = ContextualSentenceTransformer(
            args.src, backbone_config=args.backbone_config, tokenizer=args.tokenizer, revision=args.revision
        )
    except ReleasedCheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model.save(str(dst))
    print(f"wrote {dst}: load it with ContextualSentenceTransformer({str(dst)!r})")
    return 0


def convert_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-convert``."""
    sys.exit(convert_run(argv))


if __name__ == "__main__":  # python -m cde_st.cli {train,eval,convert} ...
    commands = {"train": train_main, "eval": eval_main, "convert": convert_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python -m cde_st.cli {{{','.join(commands)}}} ...")
    commands[sys.argv[1]](sys.argv[2:])
