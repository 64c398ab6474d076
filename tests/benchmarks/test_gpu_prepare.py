"""benchmarks/gpu_prepare.sh: .gpu/ stays out of git through the repository's .gitignore; the script edits no git
file. Run in a scratch repository up to its first download, which ``PYTHON=false`` makes fail at once (nothing is
fetched)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_prepare.sh"


def _scratch_repository(root: Path, gitignore: str | None) -> Path:
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "benchmarks" / "gpu_prepare.sh")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    if gitignore is not None:
        (root / ".gitignore").write_text(gitignore)
    return root


def _prepare(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "benchmarks/gpu_prepare.sh", "--limit-mib", "64", str(root / "no-data")],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHON": "false", "HOME": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _excluded(root: Path) -> str:
    exclude = root / ".git" / "info" / "exclude"
    return exclude.read_text() if exclude.exists() else ""


def test_the_repositorys_gitignore_keeps_gpu_out_and_no_git_file_is_edited(tmp_path):
    root = _scratch_repository(tmp_path, "/.gpu/\n")
    before = _excluded(root)
    run = _prepare(root)
    assert run.returncode != 0 and "not git-ignored" not in run.stderr  # past the check, stopped at the download
    assert (root / ".gpu" / "wheels_a").is_dir()
    assert _excluded(root) == before  # .git/info/exclude untouched


def test_without_the_gitignore_line_it_stops_naming_it(tmp_path):
    root = _scratch_repository(tmp_path, None)
    before = _excluded(root)
    run = _prepare(root)
    assert run.returncode == 1
    assert ".gitignore lacks the line /.gpu/" in run.stderr
    assert not (root / ".gpu").exists() and _excluded(root) == before
