"""Released CDE checkpoints (cde-small-v1/v2): parity with the reference code on the tiny-weight fixture, conversion
to a native folder, loading routes and errors, real-size parameter counts, and rotary backbones in cde_st's own
position-free mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from preloaded_python import run_python
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer

from cde_st import ContextualSentenceTransformer, ContextualTransformer
from cde_st.released import (
    BACKBONE_CONFIGS,
    ReleasedCheckpointError,
    is_released_checkpoint,
    load_released,
    module_config,
)

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "cde_reference"
ATOL = 1e-5


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    if not (FIXTURE / "v2" / "model.safetensors").is_file():
        pytest.skip(f"CDE reference fixture not found at {FIXTURE}")
    return FIXTURE


@pytest.fixture(scope="module")
def inputs(fixture_dir) -> dict:
    return json.loads((fixture_dir / "inputs.json").read_text(encoding="utf-8"))


def _module_outputs(module: ContextualTransformer, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run the converted module on the fixture's stored input_ids (no re-tokenisation)."""
    out = {}
    with torch.no_grad():
        context = {k: expected[f"context.{k}"] for k in ("input_ids", "attention_mask")}
        # "dataset_embeddings": the reference fixture's (the research code's) name for the context vectors
        out["dataset_embeddings"] = module.embed_context_features(context)
        for name in ("query", "doc", "edge"):
            features = {k: expected[f"{name}.{k}"] for k in ("input_ids", "attention_mask")}
            raw = module(features, context_vectors=out["dataset_embeddings"])["sentence_embedding"]
            out[f"{name}_embeddings"] = raw
            out[f"{name}_embeddings_normalized"] = torch.nn.functional.normalize(raw, dim=-1)
    out["scores"] = out["query_embeddings_normalized"] @ out["doc_embeddings_normalized"].T
    return out


def _max_diffs(ours: dict, reference: dict) -> dict[str, float]:
    return {k: (ours[k] - reference[k]).abs().max().item() for k in ours}


def test_v2_parity_with_reference(fixture_dir):
    module = load_released(str(fixture_dir / "v2"))
    expected = load_file(fixture_dir / "v2" / "expected.safetensors")
    diffs = _max_diffs(_module_outputs(module, expected), expected)
    assert max(diffs.values()) <= ATOL, diffs


def test_v1_parity_with_sequence_rotary(fixture_dir):
    """v1 is checked against rotary along the sequence (NomicBERT's own and the training code's behaviour), not
    against the research hf_model.py, whose rotary acts on the head axis and cancels (see cde_st.released)."""
    module = load_released(str(fixture_dir / "v1"))
    expected = load_file(fixture_dir / "v1" / "expected.safetensors")
    reference = load_file(fixture_dir / "v1" / "counterfactual_seq_rotary.safetensors")
    ours = _module_outputs(module, expected)
    diffs = _max_diffs({k: v for k, v in ours.items() if k in reference}, reference)
    assert max(diffs.values()) <= ATOL, diffs
    # and it is not the position-free bug of hf_model.py
    assert (ours["doc_embeddings"] - expected["doc_embeddings"]).abs().max() > 0.01


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_sentence_transformer_route_matches_reference(fixture_dir, inputs, version):
    """Texts in, normalised embeddings out: the model-card procedure through set_context / encode_*."""
    reference_file = "counterfactual_seq_rotary" if version == "v1" else "expected"
    reference = load_file(fixture_dir / version / f"{reference_file}.safetensors")
    model = ContextualSentenceTransformer(str(fixture_dir / version))
    info = model.set_context(inputs["context_docs"], seed=0)
    assert info.size == model.context_size == 8
    np.testing.assert_allclose(
        model.encode_query(inputs["queries"]), reference["query_embeddings_normalized"], atol=ATOL
    )
    np.testing.assert_allclose(
        model.encode_document(inputs["documents"]), reference["doc_embeddings_normalized"], atol=ATOL
    )


def test_converted_folder_reloads_identically(fixture_dir, inputs, tmp_path):
    model = ContextualSentenceTransformer(str(fixture_dir / "v2"))
    model.set_context(inputs["context_docs"])
    queries, docs = model.encode_query(inputs["queries"]), model.encode_document(inputs["documents"])
    model.save(str(tmp_path / "native"))
    assert (tmp_path / "native" / "cde_config.json").is_file()
    reloaded = ContextualSentenceTransformer(str(tmp_path / "native"))
    assert reloaded.context_info == model.context_info
    assert np.abs(reloaded.encode_query(inputs["queries"]) - queries).max() == 0
    assert np.abs(reloaded.encode_document(inputs["documents"]) - docs).max() == 0
    plain = SentenceTransformer(str(tmp_path / "native"), trust_remote_code=True)
    assert np.abs(plain.encode_query(inputs["queries"]) - queries).max() == 0


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


def test_small_corpus_and_short_context_are_tiled(fixture_dir, inputs):
    model = ContextualSentenceTransformer(str(fixture_dir / "v2"))
    three = inputs["context_docs"][:3]
    info = model.set_context(three)
    assert info.size == 8 and info.corpus_size == 3  # oversampled evenly, as the released cards ask
    tiled = model.encode_document(inputs["documents"])
    vectors = model.embed_context(three)  # already tiled to 8 rows
    assert vectors.shape[0] == 8
    short = model.encode_document(inputs["documents"], context_vectors=model.embed_context(three)[:3])
    np.testing.assert_allclose(short, tiled, atol=1e-6)


def test_short_names_and_detection(fixture_dir, tmp_path):
    assert is_released_checkpoint("cde-small") and is_released_checkpoint("cde-small-v1")
    assert is_released_checkpoint(str(fixture_dir / "v1"))
    assert not is_released_checkpoint(str(tmp_path))


def test_offline_errors_name_what_is_missing(fixture_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ReleasedCheckpointError, match=r"config\.json.*jxm/cde-small-v2"):
        ContextualSentenceTransformer("cde-small", cache_folder=str(tmp_path / "empty_cache"))
    # a copy of the released files only: the backbone config must come from the hub, which is unreachable
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(fixture_dir / "v2" / name, bare / name)
    with pytest.raises(ReleasedCheckpointError, match="backbone_config.json"):
        ContextualSentenceTransformer(str(bare), cache_folder=str(tmp_path / "empty_cache"))
    # given explicitly, backbone config and tokenizer take precedence over the hub
    model = ContextualSentenceTransformer(
        str(bare), backbone_config=str(fixture_dir / "v2" / "backbone_config.json"), tokenizer=str(fixture_dir / "v2")
    )
    assert model.context_size == 8
    (bare / "model.safetensors").unlink()
    with pytest.raises(ReleasedCheckpointError, match="model.safetensors"):
        ContextualSentenceTransformer(
            str(bare),
            backbone_config=str(fixture_dir / "v2" / "backbone_config.json"),
            tokenizer=str(fixture_dir / "v2"),
        )


# Public configs of the released backbones, model fields only (their one home: cde_st.released.BACKBONE_CONFIGS).
MODERNBERT_BASE = BACKBONE_CONFIGS["answerdotai/ModernBERT-base"]
NOMIC_BERT_2048 = BACKBONE_CONFIGS["nomic-ai/nomic-bert-2048"]


@pytest.mark.parametrize(
    ("version", "raw", "expected_millions"),
    [("v2", MODERNBERT_BASE, 305.7), ("v1", NOMIC_BERT_2048, 281.1)],
)
def test_real_size_configs_build_offline(fixture_dir, version, raw, expected_millions):
    """The released sizes (512 context slots) build on the meta device, nothing downloaded or allocated."""
    from transformers import AutoTokenizer

    from cde_st.released import backbone_config

    cde = json.loads((fixture_dir / version / "config.json").read_text(encoding="utf-8"))
    cde["transductive_corpus_size"] = 512
    config = backbone_config(raw)
    tokenizer = AutoTokenizer.from_pretrained(str(fixture_dir / version), trust_remote_code=False)
    with torch.device("meta"):
        module = ContextualTransformer(config, config, tokenizer, module_config(cde, config.model_type))
    assert module.context_size == 512
    # the reference parameters; cde_st adds one null vector (768) of its own
    reference = sum(p.numel() for n, p in module.named_parameters() if n != "null_vector")
    assert round(reference / 1e6, 1) == expected_millions


# ---------------------------------------------------------------------------------------------------------------
# Rotary backbones in cde_st's own (position-free) mode


@pytest.fixture(scope="module", params=["modernbert", "nomic_bert"])
def tiny_rotary_dir(request, fixture_dir, tmp_path_factory) -> str:
    """A tiny random ModernBERT / NomicBERT saved as a HF folder with the fixture tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    from cde_st.released import backbone_config

    version = "v2" if request.param == "modernbert" else "v1"
    raw = json.loads((fixture_dir / version / "backbone_config.json").read_text(encoding="utf-8"))
    torch.manual_seed(0)
    model = AutoModel.from_config(backbone_config(raw))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(str(fixture_dir / version), trust_remote_code=False).save_pretrained(path)
    return str(path)


def test_rotary_backbone_own_mode(tiny_rotary_dir, inputs, tmp_path):
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir,
        context_size=8,
        max_seq_length=64,
        output_head="mlp",
        first_stage_residual=False,
        context_attention="joint",
    )
    model.eval()
    docs = inputs["documents"]
    ctx = torch.randn(8, model.contextual_module.hidden_size, generator=torch.Generator().manual_seed(0))
    a = model.encode_document(docs, context_vectors=ctx)
    b = model.encode_document(docs, context_vectors=ctx[torch.randperm(8)])
    np.testing.assert_allclose(a, b, atol=1e-5)  # the context is a set: no positions for context rows
    assert np.abs(a - model.encode_document(docs, context_vectors=ctx[:3])).max() > 1e-4
    alone = np.stack([model.encode_document([d], context_vectors=ctx)[0] for d in docs])
    np.testing.assert_allclose(alone, a, atol=1e-5)  # padding and batch mates do not leak
    model.set_context(inputs["context_docs"])
    before = model.encode_query(inputs["queries"])
    model.save(str(tmp_path / "saved"))
    after = ContextualSentenceTransformer(str(tmp_path / "saved")).encode_query(inputs["queries"])
    assert np.abs(before - after).max() == 0


def test_eval_kit_runs_a_released_model(fixture_dir, tmp_path):
    """eval/run_mteb.py --model <released> loads it natively and uses the released prompt conventions."""
    from cde_st.evaluation import evaluate_model
    from cde_st.evaluation.runner import load_model

    folder = tmp_path / "data" / "retrieval" / "tinyret"
    (folder / "qrels").mkdir(parents=True)
    topics = ["cells make energy", "bees dance for flowers", "volcanoes cool the climate", "interest rates"]
    corpus = [{"_id": f"d{i}", "title": "", "text": f"{topics[i % 4]} {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": topics[i % 4]} for i in range(4)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4))
    )

    model = load_model(str(fixture_dir / "v2"))
    assert isinstance(model, ContextualSentenceTransformer) and model.context_size == 8
    report = evaluate_model(
        model, ["tinyret"], data_dir=tmp_path / "data", output_dir=tmp_path / "out", show_progress_bar=False
    )
    (entry,) = report.runs[0].context_log
    assert entry["size"] == 8 and entry["prompt"] == "search_document: " and entry["pool_size"] == 12
    assert 0.0 <= report.score("tinyret") <= 100.0


@pytest.mark.parametrize("attention", ["cached", "joint"])
def test_rotary_backbone_zero_gate_is_the_encoder(tiny_rotary_dir, inputs, attention):
    """With the context gate at zero a ModernBERT / NomicBERT contextual model is exactly its encoder (rotary text
    positions, ModernBERT's sliding window and final norm included), whatever the context."""
    from transformers import AutoModel

    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir,
        context_size=8,
        max_seq_length=64,
        output_head="none",
        context_gate=True,
        context_attention=attention,
        prompts={},
    )
    model.eval()
    module = model.contextual_module
    encoder = AutoModel.from_pretrained(tiny_rotary_dir).eval()
    features = module.preprocess(inputs["documents"])
    with torch.no_grad():
        hidden = encoder(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).float()
        expected = (hidden * mask).sum(1) / mask.sum(1)
    ctx = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(0))
    for context in (ctx, ctx[:3], None):
        kwargs = {} if context is None else {"context_vectors": context}
        got = model.encode(inputs["documents"], convert_to_tensor=True, **kwargs)
        assert (got - expected).abs().max() <= 1e-5
    with torch.no_grad():
        module.gates.fill_(0.5)
    assert (
        model.encode(inputs["documents"], convert_to_tensor=True, context_vectors=ctx) - expected
    ).abs().max() > 1e-4


def test_rotary_backbone_cached_equals_uncached(tiny_rotary_dir, inputs):
    """Cached mode on rotary backbones equals the joint sequence run through the backbone with a 4-D mask in which
    context rows (unrotated) see only context rows."""
    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir, context_size=8, max_seq_length=64, output_head="none", context_attention="cached", prompts={}
    )
    model.eval()
    module = model.contextual_module
    backbone, adapter = module.second_stage, module.second_adapter
    if backbone.config.model_type == "modernbert":  # the 4-D mask below has no sliding window: make all layers global
        backbone.config.layer_types = ["full_attention"] * backbone.config.num_hidden_layers
        for layer in backbone.layers:
            layer.attention_type = "full_attention"
            layer.attn.sliding_window = None
    ctx = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(0))
    model.set_context(ctx)
    got = model.encode(inputs["documents"], convert_to_tensor=True)
    features = module.preprocess(inputs["documents"])
    ids, mask = features["input_ids"], features["attention_mask"]
    with torch.no_grad():
        text = adapter.embed_tokens(backbone, ids, None)
        hidden = torch.cat([ctx.unsqueeze(0).expand(len(ids), -1, -1), text], dim=1)
        rows = torch.arange(8 + ids.shape[1])
        allowed = (rows[:, None] >= 8) | (rows[None, :] < 8)
        mask4d = torch.cat([mask.new_ones(len(ids), 8), mask], 1).bool()[:, None, None, :] & allowed[None, None]
        positions = torch.cat([torch.full((8,), -1), torch.arange(ids.shape[1])])
        out = adapter.encode(backbone, hidden, mask4d, positions, 8)[:, 8:]
        m = mask.unsqueeze(-1).float()
        expected = (out * m).sum(1) / m.sum(1)
    assert (got - expected).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------
# Configs that would be misread: refused, naming the file and the field


def _copy(fixture_dir, tmp_path, version="v2", config=None, backbone=None, drop=()):
    folder = tmp_path / f"{version}-edited"
    shutil.copytree(fixture_dir / version, folder)
    for name, edits in (("config.json", config), ("backbone_config.json", backbone)):
        if edits:
            values = json.loads((folder / name).read_text(encoding="utf-8"))
            values.update(edits)
            (folder / name).write_text(json.dumps(values), encoding="utf-8")
    for name in drop:
        (folder / name).unlink()
    return folder


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        ({"transductive_corpus_size": 0}, r"transductive_corpus_size.*0.*>= 1"),
        ({"transductive_corpus_size": 8.7}, r"'transductive_corpus_size' = 8\.7 \(float\): expected int"),
        ({"transductive_corpus_size": None}, r"'transductive_corpus_size' = None"),
        (
            {"pool_ignore_instruction_tokens": "false"},
            r"'pool_ignore_instruction_tokens' = 'false' \(str\): expected bool",
        ),
        ({"disable_transductive_rotary_embedding": "no"}, r"'disable_transductive_rotary_embedding' = 'no'"),
        ({"max_seq_length": "long"}, r"'max_seq_length' = 'long' \(str\): expected int"),
        ({"transductive_sequence_dropout_prob": "none"}, r"'transductive_sequence_dropout_prob' = 'none'"),
    ],
)
def test_a_released_config_field_that_would_be_misread_is_refused_naming_it(fixture_dir, tmp_path, edits, expected):
    folder = _copy(fixture_dir, tmp_path, config=edits)
    with pytest.raises(ReleasedCheckpointError, match=expected) as err:
        ContextualSentenceTransformer(str(folder))
    assert str(folder / "config.json") in str(err.value)


@pytest.mark.parametrize(
    ("version", "edits", "expected"),
    [
        ("v2", {"hidden_size": "32x"}, r"'hidden_size' = '32x' \(str\): expected int"),
        ("v2", {"num_attention_heads": 3}, r"num_attention_heads.*3.*hidden_size 32"),
        ("v2", {"local_attention": -2}, r"'local_attention' = -2"),
        ("v2", {"norm_eps": "small"}, r"'norm_eps' = 'small'"),
        ("v2", {"global_rope_theta": 0}, r"'global_rope_theta' = 0"),
        ("v1", {"n_head": "four"}, r"'n_head' = 'four'"),
        ("v1", {"layer_norm_epsilon": -1.0}, r"'layer_norm_epsilon' = -1\.0"),
    ],
)
def test_a_backbone_config_field_that_would_be_misread_is_refused_naming_the_file(
    fixture_dir, tmp_path, version, edits, expected
):
    folder = _copy(fixture_dir, tmp_path, version=version, backbone=edits)
    with pytest.raises(ReleasedCheckpointError, match=expected) as err:
        ContextualSentenceTransformer(str(folder))
    assert "backbone_config.json" in str(err.value)


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ("modernbert", "num_attention_heads", 6),
        ("modernbert", "local_attention", 256),
        ("modernbert", "global_rope_theta", 10000.0),
        ("modernbert", "norm_eps", 1e-6),
        ("nomic_bert", "n_head", 6),
        ("nomic_bert", "rotary_emb_base", 10000),
        ("nomic_bert", "layer_norm_epsilon", 1e-5),
    ],
)
def test_a_backbone_edit_that_keeps_the_released_shapes_is_refused(fixture_dir, raw, field, value):
    """The released weights fit only their embedder's architecture: a config with the released backbone's sizes but
    another head count, window, rope theta or norm eps would load (the shapes fit) and compute another model."""
    from cde_st.released import check_backbone_config

    public = dict(MODERNBERT_BASE if raw == "modernbert" else NOMIC_BERT_2048)
    embedder = "answerdotai/ModernBERT-base" if raw == "modernbert" else "nomic-ai/nomic-bert-2048"
    check_backbone_config(public, embedder, "backbone_config.json")  # the embedder's own config passes
    with pytest.raises(ReleasedCheckpointError, match=rf"backbone_config\.json.*{field}.*{value}.*{embedder}"):
        check_backbone_config({**public, field: value}, embedder, "backbone_config.json")


def test_a_folder_without_or_with_a_garbled_config_names_the_file(fixture_dir, tmp_path):
    folder = _copy(fixture_dir, tmp_path, drop=["config.json"])
    with pytest.raises(ReleasedCheckpointError, match=rf"{folder / 'config.json'} is missing"):
        ContextualSentenceTransformer(str(folder))
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ReleasedCheckpointError, match=rf"{folder / 'config.json'} is not a readable JSON file"):
        ContextualSentenceTransformer(str(folder))


def test_convert_refuses_a_misread_config_and_writes_nothing(fixture_dir, tmp_path):
    folder = _copy(fixture_dir, tmp_path, config={"transductive_corpus_size": 0})
    refused = run_python(["-m", "cde_st.cli", "convert", str(folder), str(tmp_path / "out")])
    assert refused.returncode == 2 and "transductive_corpus_size" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_hub_id_offline_is_a_clear_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        OSError, match=r"'someone/not-a-cde-model' is not a local folder and not in the .*cache.*offline"
    ):
        ContextualSentenceTransformer("someone/not-a-cde-model", cache_folder=str(tmp_path / "empty_cache"))
