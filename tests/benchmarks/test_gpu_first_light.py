"""benchmarks/speed/gpu_first_light.py: its --smoke run measures every section on the CPU, and its time budgets
skip what does not fit (the script's real run is on a GPU, which the tests never need)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch
from preloaded_python import run_python

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "gpu_first_light.py"


def run_script(*args: str, out: Path, timeout: int = 300) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = run_python([str(SCRIPT), "--smoke", "--threads", "1", "--out", str(out), *args], env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "first_light.json").read_text(encoding="utf-8")), result.stdout


def test_smoke_run_measures_every_section(tmp_path):
    report, stdout = run_script(out=tmp_path)
    assert {name: s["status"] for name, s in report["sections"].items()} == dict.fromkeys(
        ["agreement", "encode", "step", "sdpa", "kmeans", "surrogate"], "done"
    )
    rows = report["rows"]
    assert [r["status"] for section in rows.values() for r in section] == ["ok"] * sum(map(len, rows.values()))
    agreement = {r["architecture"]: r for r in rows["agreement"]}
    assert len(agreement) == 4
    compared = [row for row in rows["agreement"] if "device_fp32_vs_cpu_fp32_max_abs" in row]
    assert len(compared) == 3  # mini cached, mini joint, v2
    for row in compared:  # CPU against CPU in the smoke run: the same numbers
        assert row["device_fp32_vs_cpu_fp32_max_abs"] == 0.0 and row["bf16_vs_fp32_min_cosine"] > 0.9
    (paths,) = [row for row in rows["agreement"] if "cache_reused_vs_built_max_abs" in row]
    assert paths["cache_reused_vs_built_max_abs"] <= 1e-5 and paths["gate0_context_vs_no_context_max_abs"] <= 1e-5
    encode = {(r["model"], r["batch"]) for r in rows["encode"]}
    assert len(encode) == 10 and all(r["docs_per_s"] > 0 and r["queries_per_s"] > 0 for r in rows["encode"])
    assert {(r["model"], r["gradient_caching"] != "off") for r in rows["step"]} == {
        (m, c) for m in ("contextual", "biencoder") for c in (False, True)
    }
    assert all(r["step_s"] > 0 and r["loss"] == r["loss"] for r in rows["step"])
    assert len(rows["sdpa"]) == 6 and all(isinstance(r["default"], dict) and r["math"] == "runs" for r in rows["sdpa"])
    torch_rows = [r for r in rows["kmeans"] if r["implementation"].startswith("torch")]
    assert len(torch_rows) == 1 and torch_rows[0]["k"] == 30 and torch_rows[0]["where"] == "cpu"
    surrogate = {r["surrogate"]: r for r in rows["surrogate"]}
    assert len(surrogate) == 5 and all(r["pairs_per_s"] > 0 for r in surrogate.values())
    # the precisions are compared with the first float32 row: TF32 is float32 on a CPU; half precision is close
    assert surrogate["fp32, TF32 matmuls"]["min_cosine_to_fp32"] > 0.9999
    assert surrogate["bfloat16 weights"]["min_cosine_to_fp32"] > 0.9
    markdown = (tmp_path / "first_light.md").read_text(encoding="utf-8")
    assert all(f"## {name}" in markdown for name in rows) and "smoke run" in markdown
    assert "agreement mini" in stdout and "k-means torch" in stdout


def test_budgets_skip_what_does_not_fit(tmp_path):
    report, _ = run_script(
        "--sections", "step", "kmeans", "--budget", "step=0", "kmeans=30", "--total-s", "10", out=tmp_path
    )
    assert report["sections"]["kmeans"]["status"].startswith("skipped: its budget (30.0 s) exceeds")
    assert report["sections"]["step"]["status"] == "done"
    assert report["rows"]["step"] and all(
        r["status"].startswith("skipped: would not fit") for r in report["rows"]["step"]
    )


def test_torch_kmeans_recovers_separated_clusters(monkeypatch):
    # the sections module imports its neighbours (benchmarks/speed/) and the shared harness (benchmarks/), as the
    # script's worker process does
    monkeypatch.syspath_prepend(str(SCRIPT.parents[1]))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("first_light_sections", SCRIPT.parent / "first_light_sections.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(0)
    centers = torch.nn.functional.normalize(torch.randn(4, 32, generator=generator), dim=1)
    points = torch.nn.functional.normalize(
        centers.repeat_interleave(50, 0) + 0.05 * torch.randn(200, 32, generator=generator), dim=1
    )
    found = module.torch_spherical_kmeans(points, k=4, niter=20, seed=0)
    assert found.shape == (4, 32) and torch.allclose(found.norm(dim=1), torch.ones(4), atol=1e-5)
    best = (centers @ found.T).max(dim=1).values  # every true centre has a centroid next to it
    assert best.min() > 0.98
