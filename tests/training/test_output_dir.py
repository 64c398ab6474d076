"""cde_st.training.output_dir: earlier runs in the output folder are protected; resume and overwrite rules."""

from __future__ import annotations

import json

import pytest

from cde_st.cli import train_main
from cde_st.training import TrainConfig, train


@pytest.mark.slow
def test_cli_refuses_a_used_output_dir_and_overwrites_only_when_asked(tmp_path, capsys):
    out = tmp_path / "bi"
    common = ["--preset", "tiny", "--output-dir", str(out), "--set", "model=biencoder", "batching=random"]
    common += ["filter_false_negatives=false", "max_steps=4"]
    train_main(common)
    weights = (out / "checkpoint-4" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit):
        train_main(common)
    assert "--overwrite-output-dir" in capsys.readouterr().err
    assert (out / "checkpoint-4" / "model.safetensors").read_bytes() == weights
    with pytest.raises(SystemExit):
        train_main([*common, "learning_rate=1e-2", "--resume"])
    assert "learning_rate: 0.001 -> 0.01" in capsys.readouterr().err
    assert json.loads((out / "train_config.json").read_text())["learning_rate"] == 1e-3
    train_main([*common, "learning_rate=1e-2", "max_steps=2", "--overwrite-output-dir"])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # the earlier run's are gone
    assert json.loads((out / "train_config.json").read_text())["learning_rate"] == 1e-2
    train_main([*common, "learning_rate=5e-3", "max_steps=3", "--resume", "--allow-config-change"])
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3


def _fake_run(folder, cfg):
    """An output folder as a run of ``cfg`` leaves it: train_config.json, a checkpoint, a final model."""
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoint-2" / "model.safetensors").write_text("weights of the earlier run")
    (folder / "final").mkdir()
    (folder / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))


def test_existing_output_dir_is_refused_without_resume_or_overwrite(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), model="biencoder", batching="random")
    _fake_run(out, cfg)
    with pytest.raises(FileExistsError, match=r"run.*checkpoint-2.*--resume.*--overwrite-output-dir"):
        train(cfg)
    assert (out / "checkpoint-2" / "model.safetensors").read_text() == "weights of the earlier run"


def test_resume_with_a_changed_config_is_refused_and_lists_the_fields(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), model="biencoder", batching="random")
    _fake_run(out, cfg)
    before = (out / "train_config.json").read_text()
    changed = TrainConfig.from_preset(
        "tiny", output_dir=str(out), model="biencoder", batching="random", learning_rate=5e-3, temperature=0.05
    )
    with pytest.raises(ValueError, match=r"changed config") as err:
        train(changed, resume=True)
    message = str(err.value)
    assert "learning_rate: 0.001 -> 0.005" in message and "temperature: 0.02 -> 0.05" in message
    assert "allow-config-change" in message and "train_config.json" in message
    assert (out / "train_config.json").read_text() == before


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    cfg = TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "empty"), model="biencoder", batching="random")
    with pytest.raises(FileNotFoundError, match=r"empty.*no checkpoint"):
        train(cfg, resume=True)


@pytest.mark.parametrize("inside", ["final", "checkpoint-2"])
def test_overwrite_refuses_to_remove_an_input_of_the_run(tmp_path, capsys, inside):
    out = tmp_path / "run"
    for name in ("final", "checkpoint-2"):
        (out / name).mkdir(parents=True)
        (out / name / "model.safetensors").write_bytes(b"weights of " + name.encode())
    argv = ["--preset", "tiny", "--output-dir", str(out), "--overwrite-output-dir"]
    argv += ["--set", "model=continue", f"init_from={out / inside}"]
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "init_from" in err and "Nothing was removed" in err
    for name in ("final", "checkpoint-2"):
        assert (out / name / "model.safetensors").read_bytes() == b"weights of " + name.encode()


def test_overwrite_refuses_to_remove_training_data_inside_the_output_folder(tmp_path):
    from cde_st.training import OutputDirError, prepare_output_dir

    out = tmp_path / "run"
    (out / "checkpoint-1").mkdir(parents=True)
    data = out / "checkpoint-1" / "pairs.jsonl"
    data.write_text('{"query": "q", "document": "d"}\n')
    cfg = TrainConfig.from_preset("tiny", output_dir=str(out), train_data=[str(data)])
    with pytest.raises(OutputDirError, match=r"train_data\[0\]"):
        prepare_output_dir(cfg, overwrite_output_dir=True)
    assert data.exists()


@pytest.mark.slow
def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "tiny"
    argv = ["--preset", "tiny", "--output-dir", str(out), "--set", "max_steps=2"]
    train_main(argv)

    def snapshot():
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = snapshot()
    assert any(name.startswith("final/") for name in before)
    capsys.readouterr()
    train_main([*argv, "--resume"])  # exit status 0: nothing to do is not an error
    err = capsys.readouterr().err
    assert "is finished" in err and "step 2" in err and "Nothing was changed" in err, err
    assert snapshot() == before
