"""The commands' ``--backend`` / ``--onnx-file`` options, defined once (cde-st-eval, cde-st-serve, cde-st-embed,
cde-st-search). Imports nothing heavy: ``cde-st-serve --help`` and its ``--workers`` parent stay light."""

from __future__ import annotations

import argparse

__all__ = ["BACKENDS", "add_backend_options"]

#: The backends a command can run a model on (``onnx``: a folder written by ``cde-st-convert MODEL OUT --to onnx``).
BACKENDS = ("torch", "onnx")


def add_backend_options(parser: argparse.ArgumentParser, default: str | None = "torch", when_unset: str = "") -> None:
    """Add ``--backend`` (default ``default``; None: ``when_unset`` says what then) and ``--onnx-file``."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=default,
        help="onnx: a folder written by `cde-st-convert MODEL OUT --to onnx`, run on ONNX Runtime"
        + (f" (default: {when_unset})" if default is None and when_unset else ""),
    )
    parser.add_argument(
        "--onnx-file", default=None, help="with --backend onnx: the graph to run, e.g. second_stage_qint8.onnx"
    )
