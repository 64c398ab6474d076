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


def test_an_unset_key_variable_and_bad_limits_are_refused(monkeypatch):
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("CDE_ST_NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit, match="CDE_ST_NO_SUCH_KEY"):
        main(["any-model", "--api-key-env", "CDE_ST_NO_SUCH_KEY"])
    with pytest.raises(SystemExit, match="max-batch-size"):
        main(["any-model", "--max-batch-size", "0"])
    with pytest.raises(SystemExit, match="max-requests-per-connection"):
        main(["any-model", "--max-requests-per-connection", "0"])
    for age in ("0", "nan"):
        with pytest.raises(SystemExit, match="max-connection-age-s"):
            main(["any-model", "--max-connection-age-s", age])
    for bad in ("-1", "inf", "nan", "many"):
        with pytest.raises(SystemExit):  # argparse names the option and the value on stderr
            main(["any-model", "--forward-overhead-tokens", bad])


def test_a_state_dir_that_cannot_be_used_is_named(cde_dir, tmp_path):
    pytest.importorskip("fastapi")
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file, not a directory")
    with pytest.raises(SystemExit, match=f"The state directory {not_a_folder} cannot be used"):
        main([cde_dir, "--state-dir", str(not_a_folder), "--port", "0"])
