"""Which bundles bring the packed ``.gpu/`` folders to an offline GPU machine when what is copied at once is limited.

    python benchmarks/gpu_bundles.py --limit-mib 64          # from the repository root, after gpu_prepare.sh

A bundle is what is copied to the GPU machine at once: the repository's files (tracked, and untracked ones git does
not ignore) and some of ``.gpu/``'s folders. Where everything fits the limit, one bundle holds it all; else bundle 1
brings the model (it stays on the machine) and bundle 2, copied to the same machine afterwards, the rest. Prints
each bundle's size and folders; exits 1 naming the bundle over the limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Bundle", "BundleTooLarge", "folder_bytes", "plan_bundles", "repository_bytes"]

MODEL = (".gpu/wheels_a", ".gpu/minilm")
SCALE_RUN = (".gpu/wheels_a", ".gpu/wheels_b", ".gpu/data", ".gpu/cache/clusters")
MIB = 2**20


@dataclass
class Bundle:
    """One copy to the GPU machine: its name, its ``.gpu/`` folders and its size with the repository's files."""

    name: str
    folders: tuple[str, ...]
    size: int

    def __str__(self) -> str:
        return f"{self.name}: {self.size / MIB:.1f} MiB: the repository and {' '.join(self.folders)}"


class BundleTooLarge(ValueError):
    """A bundle over the limit (the message names it and both sizes)."""


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 where it does not exist)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def repository_bytes(root: Path) -> int:
    """Bytes of the files git would copy: tracked ones, and untracked ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    files = (root / name for name in listed.decode().split("\0") if name)
    return sum(f.stat().st_size for f in files if f.is_file())


def plan_bundles(root: Path, limit_mib: int, repo_bytes: int | None = None) -> list[Bundle]:
    """The bundles for ``root``'s ``.gpu/`` under ``limit_mib`` MiB each: one where everything fits, else the model
    first and the scale run's folders second. Raises :class:`BundleTooLarge` where a bundle does not fit."""
    if limit_mib <= 0:
        raise ValueError(f"the limit must be a positive number of MiB, not {limit_mib}")
    repo = repository_bytes(root) if repo_bytes is None else repo_bytes

    def bundle(name: str, folders: tuple[str, ...]) -> Bundle:
        return Bundle(name, folders, repo + sum(folder_bytes(root / f) for f in folders))

    everything = bundle("one bundle", tuple(dict.fromkeys(MODEL + SCALE_RUN)))
    if everything.size <= limit_mib * MIB:
        return [everything]
    bundles = [bundle("bundle 1 (the model)", MODEL), bundle("bundle 2 (the scale run, after bundle 1)", SCALE_RUN)]
    for b in bundles:
        if b.size > limit_mib * MIB:
            raise BundleTooLarge(f"{b.name} is {b.size / MIB:.1f} MiB, over the limit of {limit_mib} MiB")
    return bundles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-mib", type=int, default=64, help="the most one copy to the GPU machine may hold")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the repository")
    args = parser.parse_args()
    if args.limit_mib <= 0:
        parser.error(f"--limit-mib takes a positive number of MiB, not {args.limit_mib}")
    try:
        bundles = plan_bundles(args.root, args.limit_mib)
    except BundleTooLarge as exc:
        sys.exit(str(exc))
    for b in bundles:
        print(b)


if __name__ == "__main__":
    main()
