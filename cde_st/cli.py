"""Console entry points: ``cde-st-train`` and ``cde-st-eval`` (``cde-st-convert`` is cde_st.convert_command;
``python -m cde_st.cli {train,eval,convert}`` runs any of the three)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cde_st import training
from cde_st.backend_options import add_backend_options
from cde_st.command_line import (
    DEBUG_HELP,
    EXPECTED_ERRORS,
    CommandParser,
    Number,
    debug_wanted,
    device_problem,
    quiet_dependencies,
    report_error,
)
from cde_st.distributed import end_process_group
from cde_st.training import (
    PRESET_TIMES,
    PRESETS,
    TRAIN_DATA_HELP,
    TrainConfig,
    TrainConfigError,
    config_yaml,
    parse_set_items,
)


def train_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-train`` (same as ``python train/train_cde.py``); exits with status 2 on an error,
    130 after Ctrl-C (SIGINT) and 143 after SIGTERM (with a checkpoint and the command to resume)."""
    status = train_run(argv)
    if status:
        sys.exit(status)


def train_run(argv: list[str] | None = None) -> int:
    """Train a contextual model (or a bi-encoder baseline) from a preset and/or a YAML/JSON config; returns the
    exit status (0; 2 after a one-line ``error: ...``; 130 / 143 after SIGINT / SIGTERM)."""
    try:
        return _train_command(argv)
    finally:
        end_process_group()  # the command owns its process: a torchrun rank exits with its process group ended


def _train_command(argv: list[str] | None) -> int:
    args = _train_parser().parse_args(argv)
    quiet_dependencies()  # cde_st's own progress at INFO; dependencies (faiss, datasets, ...) from WARNING up
    models: dict[str, str] = {}
    preset = None
    try:
        preset, cfg = _train_config(args)
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        models = {k: getattr(cfg, k) for k in ("init_from", "base_model", "surrogate", "guide")}
        training.train(
            cfg,
            resume=args.resume,
            overwrite_output_dir=args.overwrite_output_dir,
            allow_config_change=args.allow_config_change,
            allow_changed_data=args.allow_changed_data,
        )
    except training.RunFinishedError as err:
        print(f"cde-st-train: {err}", file=sys.stderr)
        return 0
    except training.TrainingInterrupted as stop:  # the run saved what it could and released its folder
        command = training.resume_command(argv, checkpoint=stop.resume_from)
        print(f"cde-st-train: {stop.describe(command)}", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # before the run began: nothing to save or resume
        print("cde-st-train: interrupted before training began; nothing was written.", file=sys.stderr)
        return 130
    except training.NoTrainingDataError:
        if debug_wanted(argv):
            raise
        source = f"preset {preset!r}" if preset else "the config"
        if args.config:
            source = f"config {args.config}" + (f" (preset {preset!r})" if preset else "")
        what = f"pass --set train_data=[PATH] ({TRAIN_DATA_HELP})"
        print(f"error: {source} has no training data: {what}", file=sys.stderr)
        return 2
    except Exception as err:
        if debug_wanted(argv):
            raise
        return report_error(err, EXPECTED_ERRORS, models, how="set {key} to a local model folder (--set {key}=PATH)")
    return 0


def _train_parser() -> argparse.ArgumentParser:
    """The options of ``cde-st-train``."""
    parser = CommandParser(
        prog="cde-st-train",
        description="Train a contextual document embedding model with SentenceTransformerTrainer.",
        epilog="Example: cde-st-train --preset mini --set train_data=[path/to/pairs] model=biencoder "
        "batching=random --output-dir runs/b\n"
        "Presets are commented YAML files (cde_st/training/presets/); --print-config prints a resolved config "
        "to copy.\n"
        "Errors are one line `error: ...` (exit status 2); --debug or CDE_ST_DEBUG=1 shows the traceback.\n"
        "Ctrl-C or SIGTERM stops at the end of the step with a checkpoint and prints the command to resume "
        "(exit status 130 / 143).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML or JSON file with TrainConfig fields (may name a `preset:`)")
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="start from a preset; train wall time: " + "; ".join(f"{k}: {v}" for k, v in PRESET_TIMES.items()),
    )
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument(
        "--output-dir",
        help="where checkpoints and the final model go (default: the config's output_dir, else "
        "runs/PRESET-MODEL-sSEED, e.g. runs/mini-biencoder-s42)",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        help="resume from the last checkpoint in output-dir (or from the given checkpoint); a finished run is left "
        "as it is",
    )
    parser.add_argument(
        "--overwrite-output-dir",
        action="store_true",
        help="replace an earlier run in output-dir (its checkpoints, final model, summary and config are removed; "
        "refused when one of them is an input of the new run, e.g. init_from)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue although the config differs from the one the checkpoints were trained with",
    )
    parser.add_argument(
        "--allow-changed-data",
        action="store_true",
        help="with --resume: continue although the training files changed since the run recorded them "
        "(train_data.json in the output folder: each file's size and sha256)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (of --preset / --config / --set) as YAML to copy into a --config file, "
        "and exit",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def _train_config(args: argparse.Namespace) -> tuple[str | None, TrainConfig]:
    """The preset started from and the checked config of ``--preset`` / ``--config`` / ``--set`` / ``--output-dir``
    (two of them naming different presets or output folders are refused)."""
    overrides = parse_set_items(args.set)
    if args.output_dir:
        if "output_dir" in overrides and overrides["output_dir"] != args.output_dir:
            raise TrainConfigError(
                f"--output-dir {args.output_dir} and --set output_dir={overrides['output_dir']} name two output "
                "folders; give one."
            )
        overrides["output_dir"] = args.output_dir
    values = TrainConfig.read_file(args.config) if args.config else {}
    if args.preset and values.get("preset") not in (None, args.preset):
        raise TrainConfigError(
            f"--preset {args.preset} and {args.config} (preset: {values['preset']}) name two presets to start "
            "from; give one (remove preset: from the file, or --preset)."
        )
    preset = args.preset or values.pop("preset", None)
    values.pop("preset", None)
    values.update(overrides)
    return preset, TrainConfig.from_preset(preset, **values) if preset else TrainConfig.from_dict(values)


#: The context sample's seed: the library's rule (cde_st.context.SEED_RULE), checked when parsed.
SEED = Number(int, at_least=0, at_most=2**32 - 1)

EVAL_DESCRIPTION = r"""Evaluate a CDE (or any sentence-transformers) model on MTEB tasks with per-task corpus context.

    python eval/run_mteb.py --model PATH_OR_NAME --tasks scifact stsbenchmark --data-dir path/to/data
    python eval/run_mteb.py --model my-cde --tasks scifact --data-dir path/to/data --context-size 0 16 64 256
    python eval/run_mteb.py --model my-cde --tasks scifact --data-dir path/to/data --context random \
        --random-corpus classification/tweet_sentiment_extraction

Tasks are mteb task names (data from the Hugging Face hub) or local folders, <data-dir>/<type>/<name>, in the formats
of cde_st.evaluation.local_tasks (a path, or a folder name found under --data-dir). Results: mteb JSON under OUTPUT_DIR/results/, summary tables
(Markdown + CSV; per task and per task type as in the CDE paper's Table 2) under OUTPUT_DIR/summary/, and for
several --context-size values a sweep table and plot. All logic lives in cde_st.evaluation.
"""


def _eval_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cde-st-eval", description=EVAL_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--model", required=True, help="model folder or hub id")
    parser.add_argument("--tasks", nargs="+", required=True, help="mteb task names, local folders or local names")
    parser.add_argument("--data-dir", help="root of local task folders: <data-dir>/<type>/<name>")
    parser.add_argument(
        "--context-size", type=Number(int, at_least=0), nargs="+", help="J (several: a sweep); default: the model's"
    )
    parser.add_argument("--context-seed", type=SEED, default=0, help="seed of the context sampling (default 0)")
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
    parser.add_argument(
        "--output-dir",
        default="outputs/mteb",  # cde_st.evaluation.runner.DEFAULT_OUTPUT_DIR
        help="the one folder results (results/, also mteb's result cache) and summaries (summary/) go to "
        "(default: outputs/mteb)",
    )
    parser.add_argument("--batch-size", type=Number(int, at_least=1), default=64)
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
    add_backend_options(parser)
    parser.add_argument(
        "--max-seq-length", type=Number(int, at_least=1), help="token limit of the inputs (default: the model's)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def eval_run(argv: list[str] | None = None) -> int:
    """Run ``cde-st-eval`` / ``python eval/run_mteb.py`` on ``argv``; returns the exit status."""
    args = _eval_parser().parse_args(argv)
    quiet_dependencies()

    # Deferred: the evaluation kit imports mteb (seconds), which the train and convert commands never need.
    from cde_st.data import DataError
    from cde_st.evaluation.runner import TaskDataError, UnknownTaskError, evaluate_model

    overrides = {}
    for item in args.prefix:
        role, sep, text = item.partition("=")
        if not sep:
            print(f"error: --prefix expects ROLE=TEXT, got {item!r}", file=sys.stderr)
            return 2
        overrides[role] = text
    prefixes = {"auto": None, "on": True, "off": False}[args.prefixes]
    problem = device_problem(args.device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
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
            backend=args.backend,
            onnx_file=args.onnx_file,
            max_seq_length=args.max_seq_length,
            identical_ids=args.identical_ids,
        )
    except Exception as err:
        if args.debug or debug_wanted(argv):
            raise
        expected = (UnknownTaskError, DataError, TaskDataError, *EXPECTED_ERRORS)
        return report_error(err, expected, {"--model": args.model}, how="pass a local model folder as --model")
    print(report.summary())
    for kind, path in sorted(report.files.items()):
        print(f"{kind}: {Path(path)}")
    return 0


def eval_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-eval`` (same as ``python eval/run_mteb.py``)."""
    sys.exit(eval_run(argv))


if __name__ == "__main__":  # python -m cde_st.cli {train,eval,convert} ...
    from cde_st.convert_command import convert_main

    commands = {"train": train_main, "eval": eval_main, "convert": convert_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python -m cde_st.cli {{{','.join(commands)}}} ...")
    commands[sys.argv[1]](sys.argv[2:])
