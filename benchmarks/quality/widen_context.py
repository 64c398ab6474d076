"""Copy a saved contextual model with more context slots, to score it at an inference J above its training J.

The `mini` recipe's slots carry no parameter of their own (cached context attention, ``prefix_positions: none``,
no soft prompt, null padding): J is only how many context vectors the second stage reads, so a copy whose
``cde_config.json`` says J = 512 reads 512 documents with the same weights. Models whose slots have positions or a
soft prompt are refused. The copy has no saved context (the eval kit sets one per task).

    python benchmarks/quality/widen_context.py runs/cmp-d-s42/final runs/var/d-s42-J512 512
    python eval/run_mteb.py --model runs/var/d-s42-J512 --context-size 512 ...
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a folder saved by a cde_st contextual model")
    parser.add_argument("target", type=Path, help="the copy to write (must not exist)")
    parser.add_argument("context_size", type=int, help="J of the copy")
    args = parser.parse_args()
    config = json.loads((args.source / "cde_config.json").read_text())
    fixed = {
        "context_attention": "cached",
        "prefix_positions": "none",
        "soft_prompt_tokens": 0,
        "context_padding": "null",
    }
    wrong = {key: config.get(key) for key, value in fixed.items() if config.get(key) != value}
    if wrong:
        raise SystemExit(f"{args.source}: its context slots are not interchangeable ({wrong}; needs {fixed})")
    if args.target.exists():
        raise SystemExit(f"{args.target} exists; choose a new folder")
    shutil.copytree(args.source, args.target, ignore=shutil.ignore_patterns("context.safetensors"))
    trained_size = config["context_size"]
    config.update(context_size=args.context_size, context_info=None)
    (args.target / "cde_config.json").write_text(json.dumps(config, indent=4))
    print(f"{args.target}: J = {args.context_size} (was {trained_size})")


if __name__ == "__main__":
    main()
