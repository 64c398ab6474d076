"""The ONNX export of contextual models (cde_st.export.onnx_export) and loading it with backend="onnx"
(cde_st.modules.onnx_runtime): the graphs compute what torch computes under any context, int8 stays close, and a
folder whose graphs do not fit its weights is refused."""

from __future__ import annotations

import json
import pickle
import shutil
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra (onnxscript) is not installed")

from cde_st import ContextualSentenceTransformer  # noqa: E402
from cde_st.convert_command import convert_run  # noqa: E402
from cde_st.export import export_onnx  # noqa: E402
from cde_st.fingerprints import model_fingerprint  # noqa: E402
from cde_st.modules.onnx_runtime import EXPORT_FOLDER, RECORD_FILE  # noqa: E402

CORPUS = [f"document {i} about w{i % 5} and w{i % 3} and rain {i % 7}" for i in range(40)]
QUERIES = ["what is w1", "rain 3 and w2 w2 w2 and more words", "x"]


def _model(make_tiny_cde, seed: int = 0, **config):
    model = make_tiny_cde(context_size=8, seed=seed, **config)
    module = model[0]
    if module.gates is not None:
        with torch.no_grad():
            module.gates.normal_(generator=torch.Generator().manual_seed(seed))  # the context read matters
    model.set_context(CORPUS)
    return model


@pytest.fixture(scope="module", params=["joint", "cached_gated"])
def exported(request, tmp_path_factory, tiny_bert_dir):
    """(torch model, exported folder with fp32 and int8 graphs) for the paper's joint attention and the mini
    recipe's cached, gated read of the top layer."""
    torch.manual_seed(0)
    config = dict(max_seq_length=64, output_head="mlp", first_stage_residual=False)
    if request.param == "joint":
        config["context_attention"] = "joint"
    else:
        config.update(context_attention="cached", context_gate=True, context_layers=[1])
    model = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=8, **config)
    model.eval()
    with torch.no_grad():
        if model[0].gates is not None:
            model[0].gates.normal_(generator=torch.Generator().manual_seed(0))
    model.set_context(CORPUS)
    folder = tmp_path_factory.mktemp("export") / "onnx-model"
    export_onnx(model, folder, quantize="int8")
    return ContextualSentenceTransformer(str(folder)), folder


def test_the_export_gives_torch_s_embeddings_under_any_context(exported):
    torch_model, folder = exported
    onnx_model = ContextualSentenceTransformer(str(folder), backend="onnx")
    assert onnx_model[0].runtime is not None and torch_model[0].runtime is None
    for encode in ("encode_query", "encode_document"):
        expected, got = getattr(torch_model, encode)(QUERIES), getattr(onnx_model, encode)(QUERIES)
        assert np.abs(expected - got).max() < 1e-5
    # A context set on each from texts: the first-stage graph makes the same vectors, the second stage reads them.
    for model in (torch_model, onnx_model):
        model.set_context(CORPUS[:12], seed=3)
    assert torch.allclose(torch_model[0].context_vectors, onnx_model[0].context_vectors, atol=1e-5)
    assert np.abs(torch_model.encode_query(QUERIES) - onnx_model.encode_query(QUERIES)).max() < 1e-5
    # A context given per call, and no context at all.
    vectors = torch_model.embed_context(CORPUS[20:], seed=1)
    expected = torch_model.encode_document(QUERIES, context_vectors=vectors)
    assert np.abs(expected - onnx_model.encode_document(QUERIES, context_vectors=vectors)).max() < 1e-5
    for model in (torch_model, onnx_model):
        model.clear_context()
    with pytest.warns(UserWarning, match="null context"):
        expected = torch_model.encode_query(QUERIES)
    with pytest.warns(UserWarning, match="null context"):
        assert np.abs(expected - onnx_model.encode_query(QUERIES)).max() < 1e-5


def test_the_record_and_the_int8_graphs(exported):
    torch_model, folder = exported
    record = json.loads((folder / EXPORT_FOLDER / RECORD_FILE).read_text())
    assert set(record["variants"]) == {"fp32", "qint8"}
    assert max(record["check_max_abs_diff"].values()) < 1e-5
    int8 = ContextualSentenceTransformer(
        str(folder), backend="onnx", model_kwargs={"file_name": "second_stage_qint8.onnx"}
    )
    assert int8[0].runtime.variant == "qint8"
    expected, got = torch_model.encode_document(CORPUS), int8.encode_document(CORPUS)
    cosines = (expected * got).sum(1) / np.linalg.norm(expected, axis=1) / np.linalg.norm(got, axis=1)
    assert cosines.min() > 0.98 and np.abs(expected - got).max() > 1e-6  # close, and really quantised
    fp32 = ContextualSentenceTransformer(str(folder), backend="onnx")
    # Each runtime is part of what the model's embeddings depend on: caches and stored contexts keep them apart.
    identities = {model_fingerprint(m) for m in (torch_model, fp32, int8)}
    fingerprints = {m[0].embedding_fingerprint() for m in (torch_model, fp32, int8)}
    assert len(identities) == 3 and len(fingerprints) == 3
    with pytest.raises(ValueError, match="not one of the graphs"):
        ContextualSentenceTransformer(str(folder), backend="onnx", model_kwargs={"file_name": "model.onnx"})


def test_a_copy_in_another_process_opens_the_same_graphs(exported):
    """Multi-process pools and Ray actors get a pickled copy of the model: sessions do not pickle, the copy reopens
    the files."""
    _, folder = exported
    model = ContextualSentenceTransformer(str(folder), backend="onnx")
    copy = pickle.loads(pickle.dumps(model))
    assert copy[0].runtime.identity == model[0].runtime.identity
    assert np.array_equal(copy.encode_query(QUERIES), model.encode_query(QUERIES))


def test_graphs_of_another_model_are_refused_naming_both_fingerprints(make_tiny_cde, exported, tmp_path):
    _, folder = exported
    mixed = tmp_path / "mixed"
    make_tiny_cde(context_size=8, seed=1).save(str(mixed))
    shutil.copytree(folder / EXPORT_FOLDER, mixed / EXPORT_FOLDER)
    record = json.loads((folder / EXPORT_FOLDER / RECORD_FILE).read_text())
    with pytest.raises(ValueError, match=f"another model \\(fingerprint {record['model_fingerprint']}\\)"):
        ContextualSentenceTransformer(str(mixed), backend="onnx")
    ContextualSentenceTransformer(str(mixed))  # the torch folder itself is whole


def test_a_replaced_graph_file_is_refused(exported, tmp_path):
    _, folder = exported
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    graph = damaged / EXPORT_FOLDER / "second_stage.onnx"
    shutil.copyfile(damaged / EXPORT_FOLDER / "second_stage_qint8.onnx", graph)
    with pytest.raises(ValueError, match="second_stage.onnx is not the graph .* records"):
        ContextualSentenceTransformer(str(damaged), backend="onnx")


def test_changed_weights_and_training_are_refused(exported):
    _, folder = exported
    model = ContextualSentenceTransformer(str(folder), backend="onnx")
    features = model.preprocess(QUERIES)
    model.train()
    with pytest.raises(ValueError, match="cannot train"):
        model(features)
    model.eval()
    with torch.no_grad():
        model[0].second_stage.encoder.layer[0].output.dense.weight.add_(0.1)
    with pytest.raises(ValueError, match="torch weights changed after its ONNX export"):
        model.encode_query(QUERIES)


def test_a_folder_without_an_export_and_other_backends(make_tiny_cde, tmp_path):
    make_tiny_cde(context_size=8).save(str(tmp_path / "plain-folder"))
    with pytest.raises(FileNotFoundError, match="has no ONNX export .*cde-st-convert"):
        ContextualSentenceTransformer(str(tmp_path / "plain-folder"), backend="onnx")
    with pytest.raises(ValueError, match="backend='openvino' is not supported .*cde-st-convert"):
        ContextualSentenceTransformer(str(tmp_path / "plain-folder"), backend="openvino")


def test_a_missing_runtime_names_the_extra(exported, monkeypatch):
    _, folder = exported
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"pip install 'cde-st\[onnx\]'"):
        ContextualSentenceTransformer(str(folder), backend="onnx")


def test_the_command_exports_and_refuses_what_it_cannot(make_tiny_cde, tmp_path, capsys):
    model = _model(make_tiny_cde, context_attention="cached", context_gate=True)
    model.save(str(tmp_path / "src"))
    assert convert_run([str(tmp_path / "src"), str(tmp_path / "dst"), "--to", "onnx"]) == 0
    assert "backend='onnx'" in capsys.readouterr().out
    assert (tmp_path / "dst" / EXPORT_FOLDER / "second_stage.onnx").is_file()
    assert not (tmp_path / "dst" / EXPORT_FOLDER / "second_stage_qint8.onnx").exists()
    assert convert_run([str(tmp_path / "src"), str(tmp_path / "dst")]) == 2  # not empty
    assert "exists and is not empty" in capsys.readouterr().err
    assert convert_run([str(tmp_path / "src"), str(tmp_path / "other")]) == 2
    assert "add --to onnx" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert_run([str(tmp_path / "src"), str(tmp_path / "other"), "--quantize", "int8"])
    assert "--quantize applies to --to onnx only" in capsys.readouterr().err


def test_a_plain_model_gets_sentence_transformers_layout(tiny_bert_dir, tmp_path):
    import onnxruntime
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    model = SentenceTransformer(modules=[Transformer(tiny_bert_dir), Pooling(32)]).eval()
    export_onnx(model, tmp_path / "plain", quantize="int8")
    graph = tmp_path / "plain" / EXPORT_FOLDER / "model.onnx"
    assert (graph.parent / "model_qint8.onnx").is_file()
    session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
    features = model[0].preprocess(QUERIES)
    feed = {i.name: features[i.name].numpy() for i in session.get_inputs()}
    (hidden,) = session.run(None, feed)
    with torch.no_grad():
        expected = model[0].auto_model(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state
    assert np.abs(hidden - expected.numpy()).max() < 1e-5


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_released_architectures_export(version, tmp_path):
    """cde-small-v1 (NomicBERT) and v2 (ModernBERT, rotary positions, joint attention over the context): tiny
    random-weight copies of both, in the released files' format."""
    from pathlib import Path

    source = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "cde_reference" / version
    if not (source / "model.safetensors").is_file():
        pytest.skip(f"CDE reference fixture not found at {source}")
    model = ContextualSentenceTransformer(str(source))
    model.set_context(CORPUS[:10])
    export_onnx(model, tmp_path / version)
    exported = ContextualSentenceTransformer(str(tmp_path / version), backend="onnx")
    for encode in ("encode_query", "encode_document"):
        expected, got = getattr(model, encode)(QUERIES), getattr(exported, encode)(QUERIES)
        assert np.abs(expected - got).max() < 1e-5
    with pytest.raises(ValueError, match="a released checkpoint is not one: export it first"):
        ContextualSentenceTransformer(str(source), backend="onnx")
