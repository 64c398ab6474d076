"""Console entry points: ``cde-st-train`` and ``cde-st-eval``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    import yaml

    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def train_main(argv: list[str] | None = None) -> None:
    """Train a contextual model (or a bi-encoder baseline) from a preset and/or a YAML/JSON config."""
    from cde_st.training import PRESETS, TrainConfig, train

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
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = _parse_overrides(args.set)
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    values = TrainConfig.read_file(args.config) if args.config else {}
    preset = args.preset or values.pop("preset", None)
    values.pop("preset", None)
    values.update(overrides)
    cfg = TrainConfig.from_preset(preset, **values) if preset else TrainConfig.from_dict(values)
    train(cfg, resume=args.resume)


def eval_main(argv: list[str] | None = None) -> None:
    """Same as ``python eval/run_mteb.py``."""
    from cde_st.evaluation.cli import main

    sys.exit(main(argv))
