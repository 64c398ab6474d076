"""The torch functions an ONNX export traces (cde_st.export.graphs), run in torch: the first-stage graph gives the
module's context vectors, and the second-stage graph, given the context as the export passes it (the prefix, or in
cached mode the prefix's stacked keys/values), gives the text states the module's own forward computes."""

from __future__ import annotations

import pytest
import torch

from cde_st.export.graphs import FirstStageGraph, SecondStageGraph
from cde_st.modules.context_attention import context_prefix, stacked_states

CORPUS = ["Rain forms when vapour condenses.", "Mars is red.", "Green tea is unoxidised.", "Cats sleep a lot."]
TEXTS = ["what causes rain", "a much longer text about the planets of the solar system and their colours"]
CONFIGS = {
    "joint": dict(context_attention="joint"),
    "cached_gated_top_layer": dict(context_attention="cached", context_gate=True, context_layers=[1]),
}


@pytest.fixture(params=list(CONFIGS))
def module(request, make_tiny_cde):
    model = make_tiny_cde(context_size=8, **CONFIGS[request.param])
    module = model[0]
    if module.gates is not None:
        with torch.no_grad():
            module.gates.normal_(generator=torch.Generator().manual_seed(0))  # the context read matters
    model.set_context(CORPUS, seed=0)
    return module


def _ids(module, texts):
    features = module.preprocess(list(texts))
    return {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


@torch.no_grad()
def test_the_first_stage_graph_gives_the_context_vectors(module):
    features = _ids(module, CORPUS)
    expected = module.embed_context_features(dict(features))
    got = FirstStageGraph(module)(**features)
    assert got.shape == expected.shape and torch.equal(got, expected)


@torch.no_grad()
def test_the_second_stage_graph_gives_the_forwards_text_states(module):
    graph = SecondStageGraph(module)
    config = module.config
    assert graph.reads_states == (config.context_attention == "cached")
    prefix = context_prefix(
        module.context_vectors.clone(), module.null_vector, module.soft_prompt, config, False, torch.float32
    )
    context = prefix
    if graph.reads_states:
        context = stacked_states(
            module.second_adapter.context_states(module.second_stage, prefix, config.context_layers)
        )
        assert context.shape[:2] == (len(graph.layers), 2)  # (R, 2, heads, P, head_dim)
    features = _ids(module, TEXTS)
    states = graph(features["input_ids"], features["attention_mask"], context, features.get("token_type_ids"))
    expected = module(dict(features))["token_embeddings"]
    assert states.shape == expected.shape
    assert (states - expected).abs().max().item() <= 1e-5
