"""The command ``cde-st-convert`` (cde_st.convert_command) on a released checkpoint: a native folder that embeds as
the original, an existing output refused, and a config that would be misread refused before anything is written.
(Its ONNX route: tests/export/test_onnx_export.py; its one-line errors: tests/test_cli.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from preloaded_python import run_python

from cde_st import ContextualSentenceTransformer

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "cde_reference"


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    if not (FIXTURE / "v2" / "model.safetensors").is_file():
        pytest.skip(f"CDE reference fixture not found at {FIXTURE}")
    return FIXTURE


@pytest.fixture(scope="module")
def inputs(fixture_dir) -> dict:
    return json.loads((fixture_dir / "inputs.json").read_text(encoding="utf-8"))


def test_convert_command(fixture_dir, inputs, tmp_path):
    dst = tmp_path / "cde-small-v1-native"
    result = run_python(["-m", "cde_st.cli", "convert", str(fixture_dir / "v1"), str(dst)])
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    assert f"backbone config: {fixture_dir / 'v1' / 'backbone_config.json'}" in result.stdout  # what it was built from
    converted = ContextualSentenceTransformer(str(dst))
    original = ContextualSentenceTransformer(str(fixture_dir / "v1"))
    ctx = original.embed_context(inputs["context_docs"])
    a = converted.encode_document(inputs["documents"], context_vectors=ctx)
    b = original.encode_document(inputs["documents"], context_vectors=ctx)
    assert np.abs(a - b).max() == 0
    refused = run_python(["-m", "cde_st.cli", "convert", str(fixture_dir / "v1"), str(dst)])
    assert refused.returncode != 0 and "exists" in refused.stderr


def test_convert_refuses_a_misread_config_and_writes_nothing(fixture_dir, tmp_path):
    folder = tmp_path / "v2-edited"
    shutil.copytree(fixture_dir / "v2", folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "transductive_corpus_size": 0}), encoding="utf-8")
    refused = run_python(["-m", "cde_st.cli", "convert", str(folder), str(tmp_path / "out")])
    assert refused.returncode == 2 and "transductive_corpus_size" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()
