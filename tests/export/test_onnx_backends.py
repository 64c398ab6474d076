"""The tools on an exported model (``--backend onnx``): cde-st-embed and cde-st-search, the evaluation kit and the
server's engine give what the torch model gives, and keep the two apart where embeddings are stored."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnxscript) is not installed")

from cde_st import ContextualSentenceTransformer  # noqa: E402
from cde_st.corpus import read_manifest  # noqa: E402
from cde_st.corpus.commands import embed_main, search_main  # noqa: E402
from cde_st.export import export_onnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from evaluation_helpers import make_retrieval  # noqa: E402

DOCS = [{"_id": f"d{i}", "title": f"topic {i % 5}", "text": f"document {i} about rain {i % 7}"} for i in range(30)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_bert_dir):
    """(torch folder, exported folder) of a tiny cached, gated contextual model."""
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_bert_dir, context_size=8, max_seq_length=64, output_head="mlp", context_attention="cached",
        context_gate=True,
    )  # fmt: skip
    model.eval()
    with torch.no_grad():
        model[0].gates.normal_(generator=torch.Generator().manual_seed(0))
    root = tmp_path_factory.mktemp("backends")
    model.save(str(root / "torch"))
    export_onnx(model, root / "onnx", quantize="int8")
    return root / "torch", root / "onnx"


def test_embed_and_search_run_on_the_export_and_record_it(folders, tmp_path, capsys):
    _, exported = folders
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    out = tmp_path / "out"
    embed_main([str(exported), str(corpus), "--out", str(out), "--quiet", "--backend", "onnx"])
    recorded = read_manifest(out)["model"]
    assert recorded["backend"] == "onnx" and recorded["onnx_file"] == "second_stage.onnx"
    capsys.readouterr()
    search_main([str(out), "rain 3", "-k", "2", "--json"])  # loads the model as the manifest records
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 2
    # The torch model (or the int8 graphs) did not make these embeddings: refused, not mixed.
    for other in (["--backend", "torch"], ["--backend", "onnx", "--onnx-file", "second_stage_qint8.onnx"]):
        with pytest.raises(SystemExit) as stop:
            search_main([str(out), "rain 3", *other])
        assert stop.value.code == 2 and "fingerprint" in capsys.readouterr().err.splitlines()[-1]


def test_a_missing_export_is_one_line(folders, tmp_path, capsys):
    original, _ = folders
    with pytest.raises(SystemExit) as stop:
        embed_main([str(original), str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "o"), "--backend", "onnx"])
    assert stop.value.code == 2 and re.match("error: .* has no ONNX export", capsys.readouterr().err.splitlines()[-1])


def test_the_evaluation_kit_scores_the_export_as_torch(folders, tmp_path):
    from cde_st.evaluation import evaluate_model

    original, exported = folders
    make_retrieval(tmp_path / "data")
    options = dict(data_dir=tmp_path / "data", output_dir=None, batch_size=4, show_progress_bar=False)
    torch_score = evaluate_model(str(original), ["tinyret"], **options).score("tinyret")
    onnx_score = evaluate_model(str(exported), ["tinyret"], backend="onnx", **options).score("tinyret")
    assert onnx_score == pytest.approx(torch_score, abs=1e-4)
    with pytest.raises(ValueError, match="needs backend='onnx'"):
        evaluate_model(str(exported), ["tinyret"], onnx_file="second_stage_qint8.onnx", **options)


def test_the_server_engine_serves_the_export(folders):
    from cde_st.serving.engine import Engine

    original, exported = folders
    torch_engine, onnx_engine = Engine(str(original)), Engine(str(exported), backend="onnx")
    try:
        assert onnx_engine.model[0].runtime is not None and onnx_engine.identity != torch_engine.identity
        texts = [d["text"] for d in DOCS]
        made = [engine.make_context("c", texts, None, seed=1) for engine in (torch_engine, onnx_engine)]
        assert torch.allclose(made[0].vectors, made[1].vectors, atol=1e-5)
        expected = torch_engine.embed(["rain 3", "topic 2"], "query", made[0]).embeddings
        got = onnx_engine.embed(["rain 3", "topic 2"], "query", made[1]).embeddings
        assert np.abs(expected - got).max() < 1e-5
    finally:
        torch_engine.close()
        onnx_engine.close()
    with pytest.raises(ValueError, match="ONNX graphs run in float32"):
        Engine(str(exported), backend="onnx", dtype="bfloat16")
