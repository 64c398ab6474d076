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
from cde_st.command_line import DEBUG_HELP, EXPECTED_ERRORS, CommandParser, Number, debug_wanted, report_error
from cde_st.corpus.output_folder import FolderBusyError
from cde_st.corpus.shards import DTYPES

__all__ = ["embed_main", "embed_run", "search_main", "search_run"]

#: Errors whose message says all: bad data, options, folders, a missing extra, a busy folder.
_EXPECTED = (ImportError, FolderBusyError, *EXPECTED_ERRORS)


#: argparse type of every count option: an integer of at least 1 (0 or a negative count means nothing, or
#: something else).
_POSITIVE_INT = Number(int, at_least=1)


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
    _add_context_options(parser)
    _add_job_options(parser)
    _add_reader_options(parser)
    parser.add_argument(
        "--index",
        choices=("auto", "flat", "ivf", "ivfpq", "none"),
        default=None,
        help="the faiss index to build (default: auto; an update keeps the folder's kind)",
    )
    _add_version_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_backend_options(
        parser, default=None, when_unset="torch; with --update / --recontextualize, as the folder records"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def _add_context_options(parser: argparse.ArgumentParser) -> None:
    """The one context the corpus is embedded with: sampled (its size and seed) or given."""
    parser.add_argument(
        "--context",
        default=None,
        help="'sample' (default: J documents of the corpus, seeded), 'model' (the model's saved context), or a "
        "context file: .npy, .safetensors (a cde-st-serve named context is STATE_DIR/contexts/NAME.safetensors)",
    )
    parser.add_argument(
        "--context-size", type=_POSITIVE_INT, default=None, help="J of a sampled context (default: the model's)"
    )
    parser.add_argument(
        "--seed", type=Number(int, at_least=0), default=None, help="the context sample's seed (default: 0)"
    )


def _add_job_options(parser: argparse.ArgumentParser) -> None:
    """Where the job embeds (processes, Ray actors), in what units, and how it stores the embeddings."""
    parser.add_argument(
        "--devices", default=None, help="one process per device, comma-separated: cpu,cpu or cuda:0,cuda:1"
    )
    parser.add_argument(
        "--ray",
        type=_POSITIVE_INT,
        default=None,
        metavar="WORKERS",
        help="embed with Ray Data on this many model actors (needs the distributed extra)",
    )
    parser.add_argument(
        "--shard-size", type=_POSITIVE_INT, default=None, help="records per shard, the unit of resumption (10000)"
    )
    parser.add_argument("--batch-size", type=_POSITIVE_INT, default=32)
    parser.add_argument(
        "--max-seq-length", type=_POSITIVE_INT, default=None, help="truncate documents to this many tokens"
    )
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="the stored embedding type (float32)")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise the stored embeddings")


def _add_reader_options(parser: argparse.ArgumentParser) -> None:
    """How the corpus is read: which fields, which split, and what happens to a bad record."""
    parser.add_argument(
        "--skip-invalid", action="store_true", help="leave bad records out (counted) instead of failing"
    )
    parser.add_argument("--id-field", default=None, help="the id column (default: _id, else id)")
    parser.add_argument("--text-field", default=None, help="the text column (default: text)")
    parser.add_argument("--title-field", default=None, help="a title put before the text (default: title; '' for none)")
    parser.add_argument("--split", default=None, help="the split of a DatasetDict folder")


def _add_version_options(parser: argparse.ArgumentParser) -> None:
    """What to do with a folder already embedded: update it, embed it again with a new context, or measure how far
    its corpus drifted (at most one of them)."""
    version = parser.add_mutually_exclusive_group()
    version.add_argument(
        "--update",
        action="store_true",
        help="bring --out up to date with CORPUS: embed added and changed documents with the folder's context, "
        "drop deleted ones",
    )
    version.add_argument(
        "--recontextualize",
        action="store_true",
        help="sample a new context from CORPUS (--context-size, --seed) and embed everything again into --out",
    )
    version.add_argument(
        "--drift",
        action="store_true",
        help="print how far the corpus in --out has moved from the documents its context was made from",
    )
    parser.add_argument("--json", action="store_true", help="with --drift: print one JSON object")


def _load(model_name: str, max_seq_length: int | None, backend: str = "torch", onnx_file: str | None = None):
    from cde_st.model_loading import load_model

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


def _reader_options(args: argparse.Namespace) -> dict:
    """The reader fields given on the command line (a title field of '' is no title)."""
    given = {"id_field": args.id_field, "text_field": args.text_field, "split": args.split}
    given = {key: value for key, value in given.items() if value is not None}
    if args.title_field is not None:
        given["title_field"] = args.title_field or None
    return given


def _embed(args: argparse.Namespace) -> None:
    from cde_st.corpus.index import build_index
    from cde_st.corpus.job import embed_corpus

    if args.drift:
        return _print_drift(args)
    if args.update or args.recontextualize:
        return _new_version(args)
    model = _load(args.model, args.max_seq_length, args.backend or "torch", args.onnx_file)
    reader_options = {"id_field": None, "text_field": "text", "title_field": "title", "split": None}
    options = {
        "model_name": _model_name(args.model),
        "context": args.context,
        "context_size": args.context_size,
        "seed": args.seed or 0,
        "shard_size": args.shard_size or 10_000,
        "batch_size": args.batch_size,
        "dtype": args.dtype or "float32",
        "normalize": args.normalize,
        "skip_invalid": args.skip_invalid,
        "reader_options": {**reader_options, **_reader_options(args)},
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
        build_index(args.out, kind=args.index or "auto", show_progress_bar=not args.quiet)


def _model_name(model: str) -> str:
    # cde-st-search loads the model the manifest names: a folder by its absolute path, from any directory.
    local = Path(model).expanduser()
    return str(local.resolve()) if local.exists() else model


def _new_version(args: argparse.Namespace) -> None:
    """--update or --recontextualize: a new version of the folder, switched to at once."""
    from cde_st.corpus.update import recontextualize_corpus, update_corpus

    flag = "--update" if args.update else "--recontextualize"
    refused = {"--context": args.context}
    if args.update:
        refused.update({"--context-size": args.context_size, "--seed": args.seed})
    given = [name for name, value in refused.items() if value is not None]
    if given:
        why = (
            "an update embeds with the context recorded in the folder (--recontextualize samples a new one)"
            if args.update
            else "a new context is sampled from CORPUS (--context-size, --seed)"
        )
        raise ValueError(f"{', '.join(given)} cannot be given with {flag}: {why}.")
    model = _load(args.model, *_recorded_loading(args))
    options = {
        "model_name": _model_name(args.model),
        "batch_size": args.batch_size,
        "devices": args.devices.split(",") if args.devices else None,
        "ray_workers": args.ray,
        "reader_options": _reader_options(args),
        "settings": {
            "dtype": args.dtype,
            "shard_size": args.shard_size,
            "normalized": args.normalize or None,
            "skip_invalid": args.skip_invalid or None,
        },
        "index": args.index,
        "show_progress_bar": not args.quiet,
    }
    if args.update:
        manifest = update_corpus(model, args.corpus, args.out, **options)
    else:
        manifest = recontextualize_corpus(model, args.corpus, args.out, args.context_size, args.seed, **options)
    last = manifest["history"][-1]
    print(
        f"{'Updated' if args.update else 'Re-contextualised'} {args.out} to version {manifest['generation']}: "
        f"{last['added']:,} added, {last['changed']:,} changed, {last['deleted']:,} deleted, "
        f"{last['unchanged']:,} unchanged; {manifest['counts']['embedded']:,} documents (context fingerprint "
        f"{(manifest['context'] or {}).get('fingerprint', 'none')})."
    )
    _print_drift(args, quiet_if_none=True)


def _recorded_loading(args: argparse.Namespace) -> tuple:
    """max_seq_length, backend and graph for a new version: as given, else as the folder records them (they are
    part of the model fingerprint an update must match)."""
    from cde_st.corpus.manifest import read_manifest

    manifest = (read_manifest(args.out) if Path(args.out).is_dir() else None) or {}
    recorded = manifest.get("model") or {}
    backend = args.backend or recorded.get("backend", "torch")
    onnx_file = args.onnx_file or (recorded.get("onnx_file") if args.backend is None else None)
    return args.max_seq_length or manifest.get("max_seq_length"), backend, onnx_file


def _print_drift(args: argparse.Namespace, quiet_if_none: bool = False) -> None:
    """The folder's drift (from its manifest: the model is not loaded), and whether CORPUS is newer than it."""
    from cde_st.corpus.drift import corpus_drift
    from cde_st.corpus.manifest import read_manifest
    from cde_st.corpus.readers import CorpusReader

    if not Path(args.out).is_dir() or read_manifest(args.out) is None:
        raise FileNotFoundError(f"{args.out}: no cde-st-embed folder (no manifest.json); run cde-st-embed first.")
    manifest = read_manifest(args.out)
    drift = corpus_drift(args.out)
    reader = CorpusReader(args.corpus, **(manifest.get("reader") or {}))
    behind = reader.content_digest() != manifest["corpus"].get("sha256")
    if args.json:
        record = {"folder": str(args.out), "generation": manifest.get("generation", 0), "corpus_changed": behind}
        print(json.dumps({**record, "drift": None if drift is None else drift.to_dict()}))
        return
    if drift is None:
        if not quiet_if_none:
            print(f"{args.out} has no drift reference (a plain model, or a folder made before drift was measured).")
    else:
        print(drift.message())
    if behind:
        print(f"{args.corpus} changed since {args.out} was last written: --update brings it up to date.")


def _search_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cde-st-search", description="Search a folder written by cde-st-embed, with its model and context."
    )
    parser.add_argument("folder", help="the folder cde-st-embed wrote")
    parser.add_argument("queries", nargs="+", help="one or more queries")
    parser.add_argument("--model", default=None, help="the model (default: the one the manifest names)")
    parser.add_argument("-k", type=_POSITIVE_INT, default=10, help="results per query")
    parser.add_argument("--nprobe", type=_POSITIVE_INT, default=None, help="inverted lists an IVF index visits")
    parser.add_argument(
        "--max-seq-length", type=_POSITIVE_INT, default=None, help="default: the one the corpus was embedded with"
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
