"""benchmarks/quality/scale_run.py: its --smoke run trains (d) and (cp) on the same batches to the same step and
scores every row on four BEIR folders without mteb (the real run is on a GPU, which the tests never need)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from preloaded_python import run_python

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "scale_run.py"


def _smoke(tmp_path, *extra, pythonpath: str | None = None):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["CDE_ST_CACHE"] = str(tmp_path / "cache")  # the sampler's clustering cache: this run's own
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return run_python([str(SCRIPT), "--smoke", *extra], env=env, timeout=600)


def test_smoke_run_trains_both_models_and_scores_every_row(tmp_path):
    result = _smoke(tmp_path, "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    assert "errors" not in report, report.get("errors")  # a failing stage is recorded, not raised
    d, cp = report["training"]["(d)"], report["training"]["(cp)"]
    # 64 tiny pairs, batch 8: 8 steps an epoch; time is plenty, so (d) plans the longest schedule, 3 epochs
    assert report["plan"]["epoch_steps"] == 8 and d["schedule"]["planned"]["total"] == 24
    assert d["steps"] == cp["steps"] == report["plan"]["planned_steps"] == 24 and d["epochs"] == cp["epochs"] == 3
    assert d["pairs_seen"] == cp["pairs_seen"] == 3 * 64
    assert d["stopped_by"] == cp["stopped_by"] == "the schedule's end"
    assert d["lr_factor_at_stop"] == cp["lr_factor_at_stop"] == 0  # the decay ran to its end
    assert d["schedule"] == {**cp["schedule"], "planned": d["schedule"]["planned"]}  # (cp) trains on (d)'s schedule
    assert report["config_d"]["max_steps"] == 24 and report["config_cp"]["max_steps"] == 24
    assert report["config_d"]["model"] == "contextual" and report["config_cp"]["model"] == "biencoder"
    assert report["config_d"]["model_config"]["pooling"] == "context" == report["settings"]["pooling"]
    assert isinstance(d["pool_strength"], float)  # the models cannot travel back: the pool's weight is recorded
    for key in ("batch_size", "cluster_size", "max_seq_length", "seed", "learning_rate", "filter_false_negatives"):
        assert report["config_d"][key] == report["config_cp"][key], key
    assert report["config_d"]["query_prompt"] == report["config_cp"]["query_prompt"] == "search_query: "
    rows = [row["row"] for row in report["table"]]
    assert rows == ["(a) zero-shot", "(a) with the prompts", "(cp)", "(d) J=0", "(d) J=4", "(d) J=8"]
    for name in ("(d) J=0", "(d) J=4", "(d) J=8"):
        j = int(name.split("=")[1])
        assert all(r["context"]["size"] == j for r in report["scores"][name].values())
    assert all(r["context"] is None for r in report["scores"]["(cp)"].values())
    # the clustering is its own stage, before either training; both trainings then load it
    assert report["clustering"]["loaded_from_cache"] is False and report["clustering"]["batches"] == 8
    assert (result.stdout + result.stderr).count("Loaded the pair clustering") == 2
    assert d["first_step_s"] is not None and d["step_s_median"] is not None
    for row in report["table"]:
        assert set(row) == {"row", "scifact", "med", "cacm", "lisa", "mean"}
        assert all(0 <= row[c] <= 100 for c in ("scifact", "med", "cacm", "lisa"))
    scifact = report["scores"]["(cp)"]["scifact"]
    assert scifact["queries"] == 8 and scifact["documents"] == 40 and scifact["identical_ids_rule"].startswith("keep")
    markdown = (tmp_path / "out" / "scale_run.md").read_text(encoding="utf-8")
    assert "| (d) J=8 |" in markdown and "smoke run" in markdown


def test_any_beir_folder_can_be_scored(tmp_path):
    folder = tmp_path / "extra_corpus"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"a passage number {i} explaining rain"} for i in range(12)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "question about rain"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td3\t1\n")
    result = _smoke(tmp_path, "--corpora", str(folder), "--max-epochs", "1", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    assert report["corpora"] == ["extra_corpus"] and "errors" not in report
    assert all(set(row) == {"row", "extra_corpus", "mean"} for row in report["table"])
    assert "| row | extra_corpus | mean of 1 |" in (tmp_path / "out" / "scale_run.md").read_text(encoding="utf-8")


def test_cluster_only_prepares_the_clustering_a_later_run_loads(tmp_path):
    """How the GPU run is prepared: --cluster-only here, the cache carried along, the run (same --work) loads it."""
    work = tmp_path / "work"
    first = _smoke(
        tmp_path, "--cluster-only", "--max-epochs", "1", "--work", str(work), "--out", str(tmp_path / "out1")
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    prepared = json.loads((tmp_path / "out1" / "scale_run.json").read_text(encoding="utf-8"))
    assert prepared["clustering"]["loaded_from_cache"] is False and prepared["training"] == {}
    assert [p.name for p in (tmp_path / "cache" / "clusters").glob("*.npz")] == [prepared["clustering"]["cache_file"]]
    second = _smoke(tmp_path, "--max-epochs", "1", "--work", str(work), "--out", str(tmp_path / "out2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    report = json.loads((tmp_path / "out2" / "scale_run.json").read_text(encoding="utf-8"))
    assert report["clustering"]["loaded_from_cache"] is True
    assert report["clustering"]["cache_file"] == prepared["clustering"]["cache_file"]
    assert report["training"]["(d)"]["steps"] == 8 and "errors" not in report  # one epoch of 8 batches


def test_work_folder_with_foreign_files_is_refused(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    result = _smoke(tmp_path, "--work", str(work), "--out", str(tmp_path / "out"))
    assert result.returncode != 0 and "holds files this script did not make" in result.stderr
    assert (work / "notes.txt").read_text() == "mine"


def test_without_model2vec_distillation_minilm_clusters_instead(tmp_path):
    """The GPU machine lacks model2vec's distillation extras: on a cache miss the run clusters with the transformer
    surrogate and says so, rather than failing every stage."""
    blocker = tmp_path / "blocker" / "skeletoken"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('skeletoken is not installed on this machine')\n")
    # one epoch (8 steps) of each model: the fallback's clustering is what is tested
    result = _smoke(tmp_path, "--max-epochs", "1", "--out", str(tmp_path / "out"), pythonpath=str(blocker.parent))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    assert set(report["errors"]) == {"cluster"} and "skeletoken" in report["errors"]["cluster"]
    assert any("MiniLM clustered" in note for note in report["notes"])
    assert report["config_d"]["surrogate_kind"] == report["config_cp"]["surrogate_kind"] == "transformer"
    assert report["training"]["(d)"]["steps"] == report["training"]["(cp)"]["steps"] == 8


def test_stop_at_step_caps_both_models_on_a_fixed_schedule(tmp_path):
    """A second seed's call trains on the schedule the first planned (--plan-steps) to the step the first reached
    (--stop-at-step), so the seeds are replicates; it may leave out the (a) rows, which do not depend on the seed."""
    result = _smoke(
        tmp_path, "--plan-steps", "12", "--stop-at-step", "10", "--eval-sizes", "0", "--no-zero-shot",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    d, cp = report["training"]["(d)"], report["training"]["(cp)"]
    assert d["steps"] == cp["steps"] == 10 and d["stopped_by"] == "--stop-at-step (10)"
    assert d["pairs_seen"] == cp["pairs_seen"] == 80 and d["epochs"] == 1.25  # into the second epoch
    assert d["schedule"] == cp["schedule"] == {"warmup_steps": 1, "total_steps": 12, "planned": None}
    assert report["plan"]["planned_by"] == "--plan-steps" and d["lr_factor_at_stop"] == round(2 / 11, 4)
    assert [row["row"] for row in report["table"]] == ["(cp)", "(d) J=0"]


def test_d_plans_the_schedule_that_fits_its_time_share(tmp_path):
    """With little time, (d) times its first steps and plans fewer steps than --max-epochs allow, so that the
    learning rate's decay ends within the budget; (cp) trains on that same schedule to the same step."""
    result = _smoke(
        tmp_path, "--max-epochs", "100", "--warmup-fraction", "2", "--budget-s", "130", "--eval-reserve-s", "90",
        "--eval-sizes", "0", "--no-zero-shot", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "scale_run.json").read_text(encoding="utf-8"))
    d, cp = report["training"]["(d)"], report["training"]["(cp)"]
    planned = d["schedule"]["planned"]
    # planned at the warm-up's end (16 steps: twice an epoch), from the median of steps 2-16
    assert planned["at_step"] == 16 and planned["cap"] == 800 and 16 <= planned["total"] < 800
    assert d["schedule"]["total_steps"] == report["plan"]["planned_steps"] == planned["total"]
    assert d["stopped_by"] in ("the schedule's end", "its wall-time share") and d["steps"] <= planned["total"]
    assert cp["steps"] == d["steps"] and cp["schedule"]["total_steps"] == planned["total"]
    assert report["config_cp"]["max_steps"] == planned["total"]


def _script():
    """benchmarks/quality/time_budget.py, the schedule and guard the scale run trains under."""
    spec = importlib.util.spec_from_file_location("time_budget", SCRIPT.parent / "time_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_schedule_is_transformers_linear_schedule():
    import torch
    from transformers import get_linear_schedule_with_warmup

    schedule = _script().LinearSchedule(warmup=5, total=40)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    reference = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=5, num_training_steps=40)
    assert [schedule.factor(step) for step in range(45)] == [reference.lr_lambdas[0](step) for step in range(45)]


def test_a_length_set_within_the_warm_up_changes_no_step_taken():
    module = _script()
    planned, fixed = module.LinearSchedule(warmup=10, total=1000), module.LinearSchedule(warmup=10, total=300)
    before = [planned.factor(step) for step in range(11)]
    planned.total = 300
    assert before == [fixed.factor(step) for step in range(11)]
    assert [planned.factor(step) for step in range(400)] == [fixed.factor(step) for step in range(400)]


def test_planned_total_fits_the_time_left():
    planned_total = _script().planned_total
    assert planned_total(11, seconds_left=100.0, step_s=0.1, cap=5000) == 11 + 900  # with the 10% margin
    assert planned_total(11, seconds_left=100.0, step_s=0.1, cap=500) == 500  # at most the cap
    assert planned_total(11, seconds_left=-3.0, step_s=0.1, cap=500) == 11  # no time left: stop where it is
