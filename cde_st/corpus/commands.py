"""The commands ``cde-st-embed MODEL CORPUS --out DIR`` and ``cde-st-search DIR "query"`` (thin over
:func:`~cde_st.corpus.embed_corpus`, :func:`~cde_st.corpus.index.build_index` and
:func:`~cde_st.corpus.index.search_index`).

Errors are the one line ``error: ...`` (exit status 2) of every cde_st command (:mod:`cde_st.command_line`); the
traceback with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cde_st.backend_options import add_backend_options
from cde_st.command_line import DEBUG_HELP, EXPECTED_ERRORS, CommandParser, debug_wanted, report_error
from cde_st.corpus.output_folder import FolderBusyError
from cde_st.corpus.shards import DTYPES

__all__ = ["embed_main", "embed_run", "search_main", "search_run"]

#: Errors whose message says all: bad data, options, folders, a missing extra, a busy folder.
_EXPECTED = (ImportError, FolderBusyError, *EXPECTED_ERRORS)


def _positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (0 or a negative count means nothing, or something else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _embed_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cde-st-embed",
        description="Embed a whole corpus with one context into resumable parquet shards, a manifest and a faiss "
        "index. Rerun the same command after a crash to finish the job.",
    )
    parser.add_argument("model", help="a model folder or hub id (contextual or plain sentence-transformers)")
    parser.add_argument(
        "corpus", help="a .jsonl[.gz] or .parquet file, a BEIR folder or a datasets save_to_disk folder"
    )
    parser.add_argument("--out", required=True, help="the output folder (shards, manifest.json, index)")
    parser.add_argument(
        "--context",
        default=None,
        help="'sample' (default: J documents of the corpus, seeded), 'model' (the model's saved context), or a "
        "context file: .npy, .safetensors (a cde-st-serve named context is STATE_DIR/contexts/NAME.safetensors)",
    )
    parser.add_argument(
        "--context-size", type=_positive_int, default=None, help="J of a sampled context (default: the model's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the context sample's seed")
    parser.add_argument(
        "--devices", default=None, help="one process per device, comma-separated: cpu,cpu or cuda:0,cuda:1"
    )
    parser.add_argument(
        "--ray",
        type=_positive_int,
        default=None,
        metavar="WORKERS",
        help="embed with Ray Data on this many model actors (needs the distributed extra)",
    )
    parser.add_argument(
        "--shard-size", type=_positive_int, default=10_000, help="records per shard (the unit of resumption)"
    )
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument(
        "--max-seq-length", type=_positive_int, default=None, help="truncate documents to this many tokens"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="the stored embedding type")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise the stored embeddings")
    parser.add_argument(
        "--skip-invalid", action="store_true", help="leave bad records out (counted) instead of failing"
    )
    parser.add_argument("--id-field", default=None, help="the id column (default: _id, else id)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--title-field", default="title", help="a title put before the text ('' for none)")
    parser.add_argument("--split", default=None, help="the split of a DatasetDict folder")
    parser.add_argument(
        "--index", choices=("auto", "flat", "ivf", "ivfpq", "none"), default="auto", help="the faiss index to build"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_backend_options(parser)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def _load(model_name: str, max_seq_length: int | None, backend: str = "torch", onnx_file: str | None = None):
    from cde_st.evaluation.models import load_model

    model = load_model(model_name, backend=backend, onnx_file=onnx_file)
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model


def embed_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-embed``; exits with status 2 after a one-line ``error: ...``."""
    status = embed_run(argv)
    if status:
        sys.exit(status)


def embed_run(argv: list[str] | None = None) -> int:
    """``cde-st-embed``; returns the exit status (0; 2 after a one-line ``error: ...``)."""
    args = _embed_parser().parse_args(argv)
    try:
        _embed(args)
    except Exception as err:
        if args.debug or debug_wanted(argv):
            raise
        return report_error(err, _EXPECTED, {"MODEL": args.model}, how="give a local model folder as MODEL")
    return 0


def _embed(args: argparse.Namespace) -> None:
    from cde_st.corpus.index import build_index
    from cde_st.corpus.job import embed_corpus

    model = _load(args.model, args.max_seq_length, args.backend, args.onnx_file)
    local = Path(args.model).expanduser()
    options = {
        # cde-st-search loads the model the manifest names: a folder by its absolute path, from any directory.
        "model_name": str(local.resolve()) if local.exists() else args.model,
        "context": args.context,
        "context_size": args.context_size,
        "seed": args.seed,
        "shard_size": args.shard_size,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "normalize": args.normalize,
        "skip_invalid": args.skip_invalid,
        "reader_options": {
            "id_field": args.id_field,
            "text_field": args.text_field,
            "title_field": args.title_field or None,
            "split": args.split,
        },
        "show_progress_bar": not args.quiet,
    }
    devices = args.devices.split(",") if args.devices else None
    manifest = embed_corpus(model, args.corpus, args.out, devices=devices, ray_workers=args.ray, **options)
    print(
        f"Embedded {manifest['counts']['embedded']:,} documents into {manifest['counts']['shards']} shards in "
        f"{args.out} (model fingerprint {manifest['model']['identity']}, context fingerprint "
        f"{(manifest['context'] or {}).get('fingerprint', 'none')}; skipped: {manifest['scan']['skipped'] or 'none'})."
    )
    if args.index != "none":
        build_index(args.out, kind=args.index, show_progress_bar=not args.quiet)


def _search_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cde-st-search", description="Search a folder written by cde-st-embed, with its model and context."
    )
    parser.add_argument("folder", help="the folder cde-st-embed wrote")
    parser.add_argument("queries", nargs="+", help="one or more queries")
    parser.add_argument("--model", default=None, help="the model (default: the one the manifest names)")
    parser.add_argument("-k", type=_positive_int, default=10, help="results per query")
    parser.add_argument("--nprobe", type=_positive_int, default=None, help="inverted lists an IVF index visits")
    parser.add_argument(
        "--max-seq-length", type=_positive_int, default=None, help="default: the one the corpus was embedded with"
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    add_backend_options(parser, default=None, when_unset="as the manifest records")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def search_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-search``; exits with status 2 after a one-line ``error: ...``."""
    status = search_run(argv)
    if status:
        sys.exit(status)


def search_run(argv: list[str] | None = None) -> int:
    """``cde-st-search``; returns the exit status (0; 2 after a one-line ``error: ...``)."""
    args = _search_parser().parse_args(argv)
    models = {"--model": args.model}  # the model the manifest names, once read
    try:
        _search(args, models)
    except Exception as err:
        if args.debug or debug_wanted(argv):
            raise
        return report_error(err, _EXPECTED, models, how="pass a local model folder as --model")
    return 0


def _search(args: argparse.Namespace, models: dict[str, str | None]) -> None:
    from cde_st.corpus.index import search_index
    from cde_st.corpus.manifest import read_manifest

    if not Path(args.folder).is_dir():
        raise FileNotFoundError(f"{args.folder}: no such folder (give the --out folder of cde-st-embed).")
    manifest = read_manifest(args.folder)
    if manifest is None:
        raise FileNotFoundError(f"{args.folder} has no manifest.json (not a folder cde-st-embed wrote).")
    recorded = manifest["model"]
    backend = args.backend or recorded.get("backend", "torch")
    onnx_file = args.onnx_file or (recorded.get("onnx_file") if args.backend is None else None)
    max_seq_length = args.max_seq_length or manifest.get("max_seq_length")
    models["--model"] = args.model or recorded["name"]
    model = _load(models["--model"], max_seq_length, backend, onnx_file)
    results = search_index(args.folder, model, args.queries, k=args.k, nprobe=args.nprobe)
    for query, hits in zip(args.queries, results):
        if args.json:
            print(json.dumps({"query": query, "hits": [{"id": i, "score": s} for i, s in hits]}))
            continue
        print(f"query: {query}")
        for rank, (doc_id, score) in enumerate(hits, start=1):
            print(f"{rank:4d}  {score:.4f}  {doc_id}")
