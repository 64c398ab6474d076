"""The commands' --backend / --onnx-file options (cde_st.backend_options): parsed the same by every command, and
one rule for what a loader receives."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from cde_st.backend_options import BACKENDS, add_backend_options, loading_kwargs


def test_the_options_parse_with_the_commands_default():
    parser = argparse.ArgumentParser()
    add_backend_options(parser)
    assert vars(parser.parse_args([])) == {"backend": "torch", "onnx_file": None}
    args = parser.parse_args(["--backend", "onnx", "--onnx-file", "second_stage_qint8.onnx"])
    assert (args.backend, args.onnx_file) == ("onnx", "second_stage_qint8.onnx")
    assert BACKENDS == ("torch", "onnx")


def test_an_unknown_backend_is_refused_by_the_parser(capsys):
    parser = argparse.ArgumentParser()
    add_backend_options(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--backend", "tensorrt"])
    assert exit_info.value.code == 2 and "invalid choice: 'tensorrt'" in capsys.readouterr().err


def test_a_command_without_a_default_says_what_it_does_then():
    parser = argparse.ArgumentParser()
    add_backend_options(parser, default=None, when_unset="the backend the folder was embedded with")
    assert parser.parse_args([]).backend is None
    assert "(default: the backend the folder was embedded with)" in " ".join(parser.format_help().split())


def test_loading_kwargs():
    assert loading_kwargs() == {"backend": "torch"}
    assert loading_kwargs("onnx") == {"backend": "onnx"}
    assert loading_kwargs("onnx", "second_stage_qint8.onnx") == {
        "backend": "onnx",
        "model_kwargs": {"file_name": "second_stage_qint8.onnx"},
    }
    with pytest.raises(ValueError, match=r"needs backend='onnx' \(--backend onnx\)"):
        loading_kwargs("torch", "second_stage.onnx")


def test_importing_it_loads_no_heavy_library():
    code = (
        "import sys, cde_st.backend_options; print([m for m in ('torch', 'sentence_transformers') if m in sys.modules])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
