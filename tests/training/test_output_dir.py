"""cde_st.training.output_dir: earlier runs in the output folder are protected; resume and overwrite rules."""

from __future__ import annotations

import json
import os
import socket

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


# ------------------------------------------------------------------------------------------- one run per folder
def _cfg(out, **fields):
    return TrainConfig.from_preset("tiny", output_dir=str(out), model="biencoder", batching="random", **fields)


def test_a_second_run_into_a_folder_in_use_is_refused_naming_the_holder(tmp_path):
    from cde_st.training import OutputDirInUseError, run_lock

    out = tmp_path / "run"
    with run_lock(str(out), command="cde-st-train --preset tiny (first)"):
        lock = json.loads((out / "cde_st_run.lock").read_text())
        assert lock["pid"] == os.getpid() and lock["host"] == socket.gethostname() and lock["started"]
        with pytest.raises(OutputDirInUseError) as err:
            train(_cfg(out, seed=7))
        message = str(err.value)
        assert f"pid {os.getpid()}" in message and socket.gethostname() in message and "(first)" in message
        assert "cde_st_run.lock" in message
        assert not (out / "train_config.json").exists()  # the second run wrote nothing
    assert not (out / "cde_st_run.lock").exists()  # released with the run


def test_the_lock_of_a_dead_process_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    import subprocess
    import sys

    from cde_st.training import run_lock

    out = tmp_path / "run"
    out.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = {"pid": gone.pid, "host": socket.gethostname(), "started": "yesterday", "command": "killed run"}
    (out / "cde_st_run.lock").write_text(json.dumps(stale))
    with caplog.at_level("WARNING"), run_lock(str(out), command="new run"):
        assert json.loads((out / "cde_st_run.lock").read_text())["pid"] == os.getpid()
    assert f"pid {gone.pid}" in caplog.text and "taking it over" in caplog.text


def test_a_lock_held_on_another_host_is_not_taken_over(tmp_path):
    from cde_st.training import OutputDirInUseError, run_lock

    out = tmp_path / "run"
    out.mkdir()
    other = {"pid": 1, "host": "another-machine", "started": "now", "command": "torchrun ..."}
    (out / "cde_st_run.lock").write_text(json.dumps(other))
    with pytest.raises(OutputDirInUseError, match=r"pid 1 on another-machine.*delete .*cde_st_run\.lock"):
        with run_lock(str(out), command="x"):
            pass
    assert json.loads((out / "cde_st_run.lock").read_text()) == other


# ------------------------------------------------------------------------------------ overwrite: only our outputs
@pytest.mark.parametrize("user_folder", ["final", "checkpoint-3"])
def test_overwrite_never_removes_a_users_folder_in_a_folder_that_never_held_a_run(tmp_path, capsys, user_folder):
    out = tmp_path / "mine"
    (out / user_folder).mkdir(parents=True)
    (out / user_folder / "model.safetensors").write_bytes(b"the user's own model")
    argv = ["--preset", "tiny", "--output-dir", str(out), "--overwrite-output-dir"]
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert user_folder in err and "not written by a cde_st run" in err and "Nothing was removed" in err
    assert (out / user_folder / "model.safetensors").read_bytes() == b"the user's own model"


def test_overwrite_removes_what_the_manifest_lists_and_nothing_else(tmp_path):
    from cde_st.training import OutputDirError, prepare_output_dir, record_outputs

    out = tmp_path / "run"
    cfg = _cfg(out)
    prepare_output_dir(cfg)
    record_outputs(str(out), "checkpoint-2", "final")
    for name in ("checkpoint-2", "final", "notes"):
        (out / name).mkdir()
    (out / "final" / "model.safetensors").write_text("ours")
    manifest = json.loads((out / "cde_st_outputs.json").read_text())
    assert {"train_config.json", "checkpoint-2", "final"} <= set(manifest["outputs"])
    prepare_output_dir(cfg, overwrite_output_dir=True)
    assert not (out / "checkpoint-2").exists() and not (out / "final").exists()
    assert (out / "notes").is_dir()  # not ours: left alone
    # a checkpoint the manifest does not list (copied in by hand) stops the overwrite
    (out / "checkpoint-9").mkdir()
    with pytest.raises(OutputDirError, match=r"checkpoint-9.*not written by a cde_st run"):
        prepare_output_dir(cfg, overwrite_output_dir=True)
    assert (out / "checkpoint-9").is_dir()


def test_a_run_folder_of_an_older_cde_st_without_manifest_is_still_overwritten(tmp_path, caplog):
    from cde_st.training import prepare_output_dir

    out = tmp_path / "run"
    cfg = _cfg(out)
    _fake_run(out, cfg)  # train_config.json, checkpoint-2, final: no manifest
    with caplog.at_level("WARNING"):
        prepare_output_dir(cfg, overwrite_output_dir=True)
    assert not (out / "checkpoint-2").exists() and not (out / "final").exists()
    assert "older cde_st" in caplog.text


def test_an_output_dir_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "out.txt"
    path.write_text("not a folder")
    with pytest.raises(SystemExit):
        train_main(["--preset", "tiny", "--output-dir", str(path)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "is a file" in err and "--output-dir" in err, err
    assert path.read_text() == "not a folder"


# ------------------------------------------------------------------------------------- resume over broken files
def _checkpoint(out, cfg, step=2):
    import torch
    from safetensors.torch import save_file

    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    save_file({"w": torch.zeros(4)}, str(ckpt / "model.safetensors"))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 4}))
    torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    torch.save({"last_epoch": step}, ckpt / "scheduler.pt")
    torch.save({"python": None}, ckpt / "rng_state.pth")
    return ckpt


@pytest.mark.parametrize(
    "broken, expected",
    [
        ("optimizer.pt", r"optimizer\.pt.*(corrupt|cannot be read)"),
        ("scheduler.pt", r"scheduler\.pt.*(corrupt|cannot be read)"),
        ("rng_state.pth", r"rng_state\.pth.*(corrupt|cannot be read)"),
        ("trainer_state.json", r"trainer_state\.json.*(corrupt|cannot be read)"),
        ("model.safetensors", r"model\.safetensors.*(corrupt|cannot be read)"),
    ],
)
def test_resume_over_a_corrupted_checkpoint_file_names_it(tmp_path, broken, expected):
    from cde_st.training import prepare_output_dir

    out = tmp_path / "run"
    cfg = _cfg(out, max_steps=4)
    ckpt = _checkpoint(out, cfg)
    (ckpt / broken).write_bytes((ckpt / broken).read_bytes()[:20])  # truncated
    with pytest.raises(ValueError, match=expected) as err:
        prepare_output_dir(cfg, resume=True)
    assert "checkpoint-2" in str(err.value) and "--resume" in str(err.value)


def test_resume_from_an_empty_checkpoint_folder_names_it(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = _cfg(out, max_steps=4)
    _checkpoint(out, cfg, step=2)
    (out / "checkpoint-4").mkdir()  # the newest: empty (the run died while saving)
    argv = ["--preset", "tiny", "--output-dir", str(out), "--set", "model=biencoder", "batching=random"]
    with pytest.raises(SystemExit):
        train_main([*argv, "max_steps=6", "--resume"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint-4" in err and "empty" in err and "checkpoint-2" in err, err


def test_a_resumed_run_of_an_older_cde_st_adopts_its_outputs_so_overwrite_still_works(tmp_path):
    from cde_st.training import prepare_output_dir, record_outputs

    out = tmp_path / "run"
    cfg = _cfg(out, max_steps=4)
    _checkpoint(out, cfg)  # an older cde_st's run: checkpoint-2 and train_config.json, no manifest
    prepare_output_dir(cfg, resume=True)
    record_outputs(str(out), "checkpoint-4")
    (out / "checkpoint-4").mkdir()
    prepare_output_dir(cfg, overwrite_output_dir=True)
    assert not (out / "checkpoint-2").exists() and not (out / "checkpoint-4").exists()
