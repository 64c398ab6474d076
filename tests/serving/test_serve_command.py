"""``cde-st-serve``'s refusals before it serves: no serve extra, an unset API-key variable, bad limits, a state
directory it cannot use."""

from __future__ import annotations

import sys

import pytest

from cde_st.serving.serve_command import main


def test_without_the_serve_extra_it_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(SystemExit, match=r"pip install 'cde_st\[serve\]'"):
        main(["any-model"])


def test_an_unset_key_variable_and_bad_limits_are_refused(monkeypatch, capsys):
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("CDE_ST_NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit, match="CDE_ST_NO_SUCH_KEY"):
        main(["any-model", "--api-key-env", "CDE_ST_NO_SUCH_KEY"])
    # every numeric option is checked when parsed: one line naming it, exit status 2 (tests/test_command_line.py)
    for option, value in [("--max-batch-size", "0"), ("--max-requests-per-connection", "0"),
                          ("--max-connection-age-s", "0"), ("--max-connection-age-s", "nan"),
                          ("--forward-overhead-tokens", "-1"), ("--forward-overhead-tokens", "many")]:  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            main(["any-model", option, value])
        assert stopped.value.code == 2
        assert f"error: argument {option}: expected" in capsys.readouterr().err


def test_a_state_dir_that_cannot_be_used_is_named(cde_dir, tmp_path):
    pytest.importorskip("fastapi")
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file, not a directory")
    with pytest.raises(SystemExit, match=f"The state directory {not_a_folder} cannot be used"):
        main([cde_dir, "--state-dir", str(not_a_folder), "--port", "0"])
