"""The ``cde-st-convert`` command: a released CDE checkpoint written as a native cde_st folder."""

from __future__ import annotations

import sys
from pathlib import Path

from cde_st.command_line import DEBUG_HELP, EXPECTED_ERRORS, CommandParser, debug_wanted, report_error
from cde_st.model import ContextualSentenceTransformer
from cde_st.released import ReleasedCheckpointError, is_released_checkpoint, offline_hub_problem

__all__ = ["convert_main", "convert_run"]


def convert_run(argv: list[str] | None = None) -> int:
    """Write a released CDE checkpoint (cde-small-v1/v2, hub id, short name or local copy) as a native cde_st
    folder, which then loads offline with ``ContextualSentenceTransformer(DST)``: no remote code, no network."""
    parser = CommandParser(
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
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)

    dst = Path(args.dst).expanduser()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        print(f"error: {dst} exists and is not empty; choose a new folder.", file=sys.stderr)
        return 2
    unreachable = offline_hub_problem(args.src)
    if unreachable:
        print(f"error: {unreachable} (cde-st-convert reads a released CDE checkpoint's files)", file=sys.stderr)
        return 2
    if not is_released_checkpoint(args.src, revision=args.revision):
        message = f"error: {args.src!r} is not a released CDE checkpoint (no config.json with the CDE fields)."
        print(message, file=sys.stderr)
        return 2
    try:
        model = ContextualSentenceTransformer(
            args.src, backbone_config=args.backbone_config, tokenizer=args.tokenizer, revision=args.revision
        )
        model.save(str(dst))
    except Exception as err:
        if args.debug or debug_wanted(argv):
            raise
        how = "give a folder with the released files as SRC"
        return report_error(err, (ReleasedCheckpointError, *EXPECTED_ERRORS), {"SRC": args.src}, how=how)
    for part, source in getattr(model[0], "released_sources", {}).items():
        print(f"{part}: {source}")
    print(f"wrote {dst}: load it with ContextualSentenceTransformer({str(dst)!r})")
    return 0


def convert_main(argv: list[str] | None = None) -> None:
    """Console entry point ``cde-st-convert``."""
    sys.exit(convert_run(argv))
