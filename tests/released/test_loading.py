"""Loading a released CDE checkpoint (cde_st.released.loading): parity with the reference code on the tiny-weight
fixture, through the module and through sentence-transformers, a converted folder reloading identically, a small
corpus tiled, the evaluation kit's route, and a missing or garbled config named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from released_helpers import copy_release
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer

from cde_st import ContextualSentenceTransformer, ContextualTransformer
from cde_st.released import ReleasedCheckpointError, load_released

ATOL = 1e-5


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


def test_eval_kit_runs_a_released_model(fixture_dir, tmp_path):
    """eval/run_mteb.py --model <released> loads it natively and uses the released prompt conventions."""
    from cde_st.evaluation import evaluate_model
    from cde_st.model_loading import load_model

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


def test_a_folder_without_or_with_a_garbled_config_names_the_file(fixture_dir, tmp_path):
    folder = copy_release(fixture_dir, tmp_path, drop=["config.json"])
    with pytest.raises(ReleasedCheckpointError, match=rf"{folder / 'config.json'} is missing"):
        ContextualSentenceTransformer(str(folder))
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ReleasedCheckpointError, match=rf"{folder / 'config.json'} is not a readable JSON file"):
        ContextualSentenceTransformer(str(folder))
