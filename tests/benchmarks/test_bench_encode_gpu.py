"""benchmarks/speed/bench_encode_gpu.py: its --smoke run measures every row on the CPU (today's encode, encode_fast,
the limit), and its time budget skips what does not fit (the real run is on a GPU, which the tests never need)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from preloaded_python import run_python

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "bench_encode_gpu.py"


def run_script(*args: str, out: Path, timeout: int = 300) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = [str(SCRIPT), "--smoke", "--threads", "1", "--repeats", "1", "--out", str(out), *args]
    result = run_python(command, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "bench_encode_gpu.json").read_text(encoding="utf-8"))


def test_smoke_run_measures_every_row(tmp_path):
    report = run_script("--profile", out=tmp_path)
    rows = report["rows"]
    labels = {(r["model"], r["dtype"], r["batch"], r["role"]) for r in rows}
    assert len(rows) == len(labels) == 2 * 2 * 2 * 2  # models x dtypes x batches x roles
    assert all(r["status"] == "ok" for r in rows)
    for row in rows:
        assert all(row[f"{m}_per_s"] > 0 for m in ("today", "new", "new_budget", "limit", "tokenise"))
        assert row["new_over_limit"] == row["new_per_s"] / row["limit_per_s"]
        if row["dtype"] == "fp32":  # the embeddings of both paths agree
            assert row["max_abs_new_vs_today"] <= 1e-6
    markdown = (tmp_path / "bench_encode_gpu.md").read_text(encoding="utf-8")
    assert markdown.count("| tiny random BERT") == 16 and "new / limit" in markdown
    assert report["environment"]["load_average_end"] and report["command"]
    for path in ("today", "new"):  # the profile of one call per path (no device on the CPU: busy share 0)
        assert report["profile"][path]["texts_per_s"] > 0 and report["profile"][path]["device_busy_share"] == 0
        assert "Self CPU" in (tmp_path / f"profile_{path}.txt").read_text(encoding="utf-8")


def test_budget_skips_the_rows_that_do_not_fit(tmp_path):
    report = run_script("--budget-s", "0", "--dtypes", "fp32", "--batches", "4", out=tmp_path)
    assert [r["status"] for r in report["rows"]] == ["skipped: --budget-s spent"] * 4
