"""``cde-st-serve``'s refusals before it serves: no serve extra, an unset API-key variable, bad limits, a state
directory it cannot use, a model that does not load; each one line ``error: ...``, exit status 2, as every cde_st
command."""

from __future__ import annotations

import sys

import pytest

from cde_st.serving.serve_command import main


def _refused(argv: list[str], capsys) -> str:
    """The one line ``main(argv)`` prints before it exits with status 2."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_without_the_serve_extra_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert "pip install 'cde_st[serve]'" in _refused(["any-model"], capsys)


def test_an_unset_key_variable_and_bad_limits_are_refused(monkeypatch, capsys):
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("CDE_ST_NO_SUCH_KEY", raising=False)
    assert "CDE_ST_NO_SUCH_KEY" in _refused(["any-model", "--api-key-env", "CDE_ST_NO_SUCH_KEY"], capsys)
    # every numeric option is checked when parsed: one line naming it, exit status 2 (tests/test_command_line.py)
    for option, value in [("--max-batch-size", "0"), ("--max-requests-per-connection", "0"),
                          ("--max-connection-age-s", "0"), ("--max-connection-age-s", "nan"),
                          ("--forward-overhead-tokens", "-1"), ("--forward-overhead-tokens", "many")]:  # fmt: skip
        assert _refused(["any-model", option, value], capsys).startswith(f"error: argument {option}: expected")


def test_a_state_dir_that_cannot_be_used_is_named(cde_dir, tmp_path, capsys):
    pytest.importorskip("fastapi")
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file, not a directory")
    line = _refused([cde_dir, "--state-dir", str(not_a_folder), "--port", "0"], capsys)
    assert f"The state directory {not_a_folder} cannot be used" in line


def test_a_model_that_does_not_load_is_named(tmp_path, monkeypatch, capsys):
    pytest.importorskip("fastapi")
    monkeypatch.chdir(tmp_path)
    line = _refused(["./no_such_model", "--port", "0"], capsys)
    assert f"Model folder './no_such_model' does not exist (looked for {tmp_path / 'no_such_model'})" in line
    # a hub id neither cached nor reachable (the tests run with HF_HUB_OFFLINE=1): named, with what to do instead
    line = _refused(["someone/no-such-model", "--port", "0"], capsys)
    assert "MODEL 'someone/no-such-model' is not in the local Hugging Face cache" in line
