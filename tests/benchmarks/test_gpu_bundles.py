"""benchmarks/gpu_bundles.py: the packed .gpu/ folders split into bundles under a size limit, checked."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_bundles.py"
MIB = 2**20


def _module():
    spec = importlib.util.spec_from_file_location("gpu_bundles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _packed(root: Path) -> Path:
    """A .gpu/ with the parts' sizes in MiB scaled down by 8: model 5.5, wheels 0.2 + 2.3, data 4.1, clusters 0.7."""
    sizes = {"wheels_a/a.whl": 0.2, "minilm/model.safetensors": 5.5, "wheels_b/b.whl": 2.3,
             "data/scale_data.tar.xz": 4.1, "cache/clusters/c.npz": 0.7, "cache/seed-42.done": 0.0}  # fmt: skip
    for name, mib in sizes.items():
        path = root / ".gpu" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * int(mib * MIB))
    return root


def test_everything_in_one_bundle_when_it_fits(tmp_path):
    (bundle,) = _module().plan_bundles(_packed(tmp_path), limit_mib=14, repo_bytes=MIB)
    assert bundle.name == "one bundle" and abs(bundle.size / MIB - 13.8) < 0.01
    assert set(bundle.folders) == {".gpu/wheels_a", ".gpu/minilm", ".gpu/wheels_b", ".gpu/data", ".gpu/cache/clusters"}


def test_the_model_travels_first_under_a_smaller_limit(tmp_path):
    one, two = _module().plan_bundles(_packed(tmp_path), limit_mib=9, repo_bytes=MIB)
    assert one.folders == (".gpu/wheels_a", ".gpu/minilm") and abs(one.size / MIB - 6.7) < 0.01
    assert ".gpu/minilm" not in two.folders and ".gpu/data" in two.folders and abs(two.size / MIB - 8.3) < 0.01


def test_a_bundle_over_the_limit_is_named(tmp_path):
    module = _module()
    with pytest.raises(
        module.BundleTooLarge, match=r"bundle 2 \(the scale run, after bundle 1\) is 8.3 MiB, over the limit of 8 MiB"
    ):
        module.plan_bundles(_packed(tmp_path), limit_mib=8, repo_bytes=MIB)
    with pytest.raises(ValueError, match="positive number of MiB, not 0"):
        module.plan_bundles(tmp_path, limit_mib=0, repo_bytes=0)


def test_command_line_counts_what_git_would_copy(tmp_path):
    root = _packed(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / ".gitignore").write_text("/.gpu/\n/runs/\n")
    (root / "code.py").write_bytes(b"x" * MIB)  # untracked, not ignored: copied
    (root / "runs").mkdir()
    (root / "runs" / "model.bin").write_bytes(b"x" * 50 * MIB)  # ignored: not copied
    run = [sys.executable, str(SCRIPT), "--root", str(root), "--limit-mib"]
    fits = subprocess.run([*run, "9"], capture_output=True, text=True)
    assert fits.returncode == 0 and fits.stdout.startswith("bundle 1 (the model): 6.7 MiB"), fits.stdout + fits.stderr
    over = subprocess.run([*run, "8"], capture_output=True, text=True)
    assert over.returncode == 1 and "over the limit of 8 MiB" in over.stderr
    bad = subprocess.run([*run, "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "positive number of MiB, not 0" in bad.stderr
