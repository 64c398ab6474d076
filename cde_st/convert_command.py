"""The ``cde-st-convert`` command: a released CDE checkpoint written as a native cde_st folder, or any model
exported to ONNX (``--to onnx``, :func:`cde_st.export.export_onnx`)."""

from __future__ import annotations

import sys
from pathlib import Path

from cde_st.command_line import DEBUG_HELP, EXPECTED_ERRORS, CommandParser, debug_wanted, report_error
from cde_st.export import QUANTIZATIONS, export_onnx
from cde_st.model import ContextualSentenceTransformer, is_contextual
from cde_st.model_loading import load_model
from cde_st.released import ReleasedCheckpointError, is_released_checkpoint, offline_hub_problem

__all__ = ["convert_main", "convert_run"]


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="cde-st-convert",
        description=convert_run.__doc__,
        epilog="Examples: cde-st-convert jxm/cde-small-v2 models/cde-small-v2; "
        "cde-st-convert models/my-cde models/my-cde-onnx --to onnx --quantize int8",
    )
    parser.add_argument(
        "src",
        help="jxm/cde-small-v2, jxm/cde-small-v1, cde-small, or a folder with the released files; with --to onnx "
        "also any saved cde_st or sentence-transformers model",
    )
    parser.add_argument("dst", help="output folder (must not exist, or be empty)")
    parser.add_argument(
        "--to",
        choices=["cde_st", "onnx"],
        default="cde_st",
        help="cde_st (default): a native folder of a released checkpoint; onnx: a model folder with ONNX graphs, "
        "loaded with backend='onnx' (the context stays an input: one export serves every context)",
    )
    parser.add_argument(
        "--quantize", choices=list(QUANTIZATIONS), help="with --to onnx: also write dynamically quantised graphs"
    )
    parser.add_argument("--backbone-config", help="the backbone's config.json (default: beside SRC, else the hub)")
    parser.add_argument("--tokenizer", help="tokenizer folder or name (default: beside SRC, else the backbone's)")
    parser.add_argument("--revision", help="hub revision of SRC")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    return parser


def convert_run(argv: list[str] | None = None) -> int:
    """Write a released CDE checkpoint (cde-small-v1/v2, hub id, short name or local copy) as a native cde_st
    folder, which then loads offline with ``ContextualSentenceTransformer(DST)``: no remote code, no network. With
    ``--to onnx``, write any model (released, cde_st or sentence-transformers) with ONNX graphs for ONNX Runtime."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quantize and args.to != "onnx":
        parser.error("--quantize applies to --to onnx only")
    dst = Path(args.dst).expanduser()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        print(f"error: {dst} exists and is not empty; choose a new folder.", file=sys.stderr)
        return 2
    unreachable = offline_hub_problem(args.src)
    if unreachable:
        print(f"error: {unreachable} (cde-st-convert reads a released CDE checkpoint's files)", file=sys.stderr)
        return 2
    released = is_released_checkpoint(args.src, revision=args.revision)
    if not released and args.to == "cde_st":
        message = f"error: {args.src!r} is not a released CDE checkpoint (no config.json with the CDE fields)."
        print(message + " To export a saved model to ONNX, add --to onnx.", file=sys.stderr)
        return 2
    try:
        if released:
            model = ContextualSentenceTransformer(
                args.src, backbone_config=args.backbone_config, tokenizer=args.tokenizer, revision=args.revision
            )
        else:
            model = load_model(args.src)
        if args.to == "onnx":
            export_onnx(model, dst, quantize=args.quantize)
        else:
            model.save(str(dst))
    except Exception as err:
        if args.debug or debug_wanted(argv):
            raise
        how = "give a folder with the released files as SRC"
        return report_error(err, (ReleasedCheckpointError, ImportError, *EXPECTED_ERRORS), {"SRC": args.src}, how=how)
    for part, source in getattr(model[0], "released_sources", {}).items():
        print(f"{part}: {source}")
    print(f"wrote {dst}: load it with {_load_line(model, dst, args)}")
    return 0


def _load_line(model, dst: Path, args) -> str:
    cls = "ContextualSentenceTransformer" if is_contextual(model) else "SentenceTransformer"
    if args.to != "onnx":
        return f"{cls}({str(dst)!r})"
    line = f"{cls}({str(dst)!r}, backend='onnx')"
    if args.quantize:
        graph = "second_stage_qint8.onnx" if is_contextual(model) else "model_qint8.onnx"
        line += f" (int8: model_kwargs={{'file_name': {graph!r}}})"
    return line


def convert_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-convert``."""
    sys.exit(convert_run(argv))
