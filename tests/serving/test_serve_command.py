"""``cde-st-serve``'s refusals before it serves: no serve extra, an unset API-key variable, bad limits, a state
directory another server holds."""

from __future__ import annotations

import sys

import pytest

from cde_st.serving.contexts import ContextStore
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


def test_a_state_dir_in_use_is_refused(cde_dir, tmp_path):
    pytest.importorskip("fastapi")
    holder = ContextStore(tmp_path, "whatever")  # another server's lock on the folder
    with pytest.raises(SystemExit, match="Another cde-st-serve process"):
        main([cde_dir, "--state-dir", str(tmp_path), "--port", "0"])
    assert holder.list() == []
