"""The commands' ``--backend`` / ``--onnx-file`` options, defined once (cde-st-eval, cde-st-serve, cde-st-embed,
cde-st-search). Imports nothing heavy: ``cde-st-serve --help`` and its ``--workers`` parent stay light."""

from __future__ import annotations

import argparse

__all__ = ["BACKENDS", "add_backend_options", "loading_kwargs"]

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


def loading_kwargs(backend: str = "torch", onnx_file: str | None = None) -> dict:
    """sentence-transformers' loading arguments for ``backend`` and ``onnx_file`` (the graph, ``model_kwargs``
    ``file_name``): what every loader of a named model passes."""
    if onnx_file is not None and backend != "onnx":
        raise ValueError(f"onnx_file={onnx_file!r} (--onnx-file) needs backend='onnx' (--backend onnx).")
    return {"backend": backend} | ({"model_kwargs": {"file_name": onnx_file}} if onnx_file is not None else {})
