"""Loading never runs code from the model folder: ContextualSentenceTransformer(path) takes the module classes from
the installed cde_st, whereas SentenceTransformer(path, trust_remote_code=True) imports a cde_st.py found in the
folder (a planted file shadows the package). The docs therefore use ContextualSentenceTransformer(path)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

import cde_st
from cde_st import ContextualSentenceTransformer, ContextualTransformer


def _plant(folder, marker) -> None:
    # A module named like the package, as a hub repo or shared folder could carry: it leaves a marker when imported
    # and then passes the real class on, so loading would otherwise look normal.
    (folder / "cde_st.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('planted cde_st.py ran')\n"
        "from cde_st.modules.contextual_transformer import ContextualTransformer  # noqa: F401\n"
    )


def test_contextual_sentence_transformer_does_not_import_a_planted_cde_st_py(make_tiny_cde, tmp_path):
    folder, marker = tmp_path / "model", tmp_path / "MARKER"
    make_tiny_cde(context_size=2).save(str(folder))
    _plant(folder, marker)

    model = ContextualSentenceTransformer(str(folder))
    assert not marker.exists()
    assert type(model[0]) is ContextualTransformer  # the installed class


def test_trust_remote_code_route_imports_the_planted_file(make_tiny_cde, tmp_path):
    # Documents why the README does not recommend this route. A subprocess, so the dynamic module lands in a
    # temporary HF_MODULES_CACHE and never in this interpreter.
    folder, marker = tmp_path / "model", tmp_path / "MARKER"
    make_tiny_cde(context_size=2).save(str(folder))
    _plant(folder, marker)
    code = (
        "from sentence_transformers import SentenceTransformer\n"
        f"SentenceTransformer({str(folder)!r}, trust_remote_code=True)\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "hf_modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.exists(), "sentence-transformers no longer imports cde_st.py from the folder: update docs/models.md"


def test_trust_remote_code_route_warns_which_call_loads_a_contextual_model(make_tiny_cde, tmp_path):
    """sentence-transformers' error on SentenceTransformer(folder) advises trust_remote_code=True; followed, the
    load warns with the call that gives a contextual model. ContextualSentenceTransformer and the clients that wrap
    its modules do not warn."""
    import warnings

    folder = tmp_path / "model"
    make_tiny_cde(context_size=2).save(str(folder))
    with pytest.warns(UserWarning, match=r"cde_st.ContextualSentenceTransformer\(path\)") as caught:
        plain = SentenceTransformer(str(folder), trust_remote_code=True)
    assert str(folder) in str(caught[0].message) and not hasattr(plain, "set_context")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model = ContextualSentenceTransformer(str(folder))
        SentenceTransformer(modules=list(model))  # a client wrapping the loaded model's modules


DOCS = [f"document {i} about {topic}" for i, topic in enumerate(["cats", "rain", "planets", "tea"] * 2)]


@pytest.mark.slow
def test_trust_remote_code_route_pool_never_uses_a_stale_context(make_tiny_cde, tmp_path):
    """A plain SentenceTransformer's multi-process workers copy the model when the pool starts: after
    cde_st.set_context they would silently encode with the old context. They raise an error naming the fix; a pool
    started after set_context encodes like the model."""
    make_tiny_cde(context_size=4).save(str(tmp_path / "m"))
    plain = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True)
    cde_st.set_context(plain, DOCS[:4], seed=0)
    pool = plain.start_multi_process_pool(["cpu"])
    try:
        np.testing.assert_allclose(plain.encode_document(DOCS, pool=pool), plain.encode_document(DOCS), atol=1e-6)
        cde_st.set_context(plain, DOCS[4:], seed=0)  # after the worker copied the model
        with pytest.raises(RuntimeError, match=r"context .*changed after .*pool.*start_multi_process_pool"):
            plain.encode_document(DOCS, pool=pool)
    finally:
        plain.stop_multi_process_pool(pool)
    pool = plain.start_multi_process_pool(["cpu"])  # the fix the error names
    try:
        np.testing.assert_allclose(plain.encode_document(DOCS, pool=pool), plain.encode_document(DOCS), atol=1e-6)
    finally:
        plain.stop_multi_process_pool(pool)
