"""ContextualSentenceTransformer / ContextualTransformer: the properties DESIGN.md section 2 pins."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS
from sentence_transformers import SentenceTransformer

import cde_st
from cde_st import ContextualSentenceTransformer

DOCS = SHORT_DOCS


def _vectors(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, model.contextual_module.hidden_size, generator=g)


def test_context_permutation_invariance(make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    ctx = _vectors(model, 8)
    a = model.encode_document(DOCS, context_vectors=ctx)
    b = model.encode_document(DOCS, context_vectors=ctx[torch.randperm(8)])
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_different_contexts_give_different_embeddings(make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    a = model.encode_document(DOCS, context_vectors=_vectors(model, 8, seed=0))
    b = model.encode_document(DOCS, context_vectors=_vectors(model, 8, seed=1))
    assert np.abs(a - b).max() > 1e-3
    model.set_context(DOCS[:5], seed=0)
    c = model.encode_document(DOCS)
    model.set_context(DOCS[5:], seed=0)
    d = model.encode_document(DOCS)
    # a random tiny first stage maps texts to nearby vectors: the change is small but far above fp noise
    assert np.abs(c - d).max() > 1e-4


def test_embedding_independent_of_batch_mates_and_padding(make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    model.set_context(DOCS, seed=0)
    alone = np.stack([model.encode_document([d])[0] for d in DOCS])
    batched = model.encode_document(DOCS, batch_size=len(DOCS))
    mixed = model.encode_document(DOCS[::-1], batch_size=3)[::-1]
    np.testing.assert_allclose(alone, batched, atol=1e-5)
    np.testing.assert_allclose(alone, mixed, atol=1e-5)


def test_save_load_identical(make_tiny_cde, tmp_path):
    model = make_tiny_cde(context_size=8)
    model.set_context(DOCS, seed=3)
    expected_q = model.encode_query(DOCS[:3])
    expected_d = model.encode_document(DOCS)
    model.save(str(tmp_path / "cde"))

    loaded = ContextualSentenceTransformer(str(tmp_path / "cde"))
    assert loaded.context_info == model.context_info
    np.testing.assert_array_equal(loaded.encode_query(DOCS[:3]), expected_q)
    np.testing.assert_array_equal(loaded.encode_document(DOCS), expected_d)

    # The plain SentenceTransformer path needs the plugin's class, hence trust_remote_code.
    plain = SentenceTransformer(str(tmp_path / "cde"), trust_remote_code=True)
    np.testing.assert_array_equal(plain.encode_document(DOCS), expected_d)
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(tmp_path / "cde"))


def test_hook_on_plain_sentence_transformer(make_tiny_cde, tmp_path):
    model = make_tiny_cde(context_size=8)
    model.save(str(tmp_path / "cde"))
    model.set_context(DOCS, seed=1)
    expected = model.encode_document(DOCS)

    plain = SentenceTransformer(str(tmp_path / "cde"), trust_remote_code=True)
    assert cde_st.is_contextual(plain)
    info = cde_st.set_context(plain, DOCS, seed=1)
    assert info.fingerprint == model.context_info.fingerprint
    np.testing.assert_allclose(plain.encode_document(DOCS), expected, atol=1e-6)
    plain[0].clear_context()
    plain[0].set_context(DOCS, seed=1)
    np.testing.assert_allclose(plain.encode_document(DOCS), expected, atol=1e-6)


def test_clear_context_falls_back_to_null_and_warns_once(make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    with pytest.warns(UserWarning, match="No context is set"):
        null = model.encode_document(DOCS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode_document(DOCS)  # only once
    model.set_context(DOCS, seed=0)
    assert model.context_info.size == 8
    model.clear_context()
    assert model.context_info is None
    with pytest.warns(UserWarning):
        again = model.encode_document(DOCS)
    np.testing.assert_allclose(null, again, atol=1e-6)


def test_pooling_ignores_context_tokens(make_tiny_cde):
    model = make_tiny_cde(context_size=8, output_head="none")
    module = model.contextual_module
    features = module.preprocess(DOCS[:4])
    with torch.inference_mode():
        out = module(dict(features), context_vectors=_vectors(model, 8))
    tokens, mask = out["token_embeddings"], features["attention_mask"]
    assert tokens.shape[:2] == features["input_ids"].shape  # context rows are dropped before pooling
    manual = (tokens * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(out["sentence_embedding"], manual, atol=1e-6, rtol=1e-5)


def test_include_prompt_false_excludes_prompt_tokens(make_tiny_cde):
    model = make_tiny_cde(context_size=4, output_head="none", include_prompt=False)
    module = model.contextual_module
    features = module.preprocess(DOCS[:2], prompt="search_document: ")
    pl = features["prompt_length"]
    assert pl == len(module.tokenizer("search_document: ")["input_ids"]) - 1
    with torch.inference_mode():
        out = module(dict(features), context_vectors=_vectors(model, 4))
    mask = features["attention_mask"].clone()
    mask[:, :pl] = 0
    manual = (out["token_embeddings"] * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(out["sentence_embedding"], manual, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("context_size", [0, 1, 7, 512])
def test_context_sizes(make_tiny_cde, context_size):
    model = make_tiny_cde(context_size=context_size)
    info = model.set_context(DOCS, seed=0)
    assert info.size == context_size
    emb = model.encode_document(DOCS[:3])
    assert emb.shape == (3, 32) and np.isfinite(emb).all()
    if context_size == 512:  # 10 documents tiled to 512, each 51 or 52 times
        assert model.contextual_module.context_vectors.shape == (512, 32)
    if context_size >= 7:  # fewer vectors than slots: null-padded, identical to explicit null rows
        module = model.contextual_module
        few = _vectors(model, 3)
        padded = torch.cat([few, module.null_vector.detach().expand(context_size - 3, -1)])
        np.testing.assert_allclose(
            model.encode_document(DOCS[:3], context_vectors=few),
            model.encode_document(DOCS[:3], context_vectors=padded),
            atol=1e-6,
        )


def test_zero_context_never_warns(make_tiny_cde):
    model = make_tiny_cde(context_size=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode_document(DOCS[:2])


def test_set_context_sampling_is_seeded_and_without_replacement(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    a = model.set_context(DOCS, seed=0).fingerprint
    b = model.set_context(DOCS, seed=0).fingerprint
    c = model.set_context(DOCS, seed=1).fingerprint
    assert a == b != c
    sampled = cde_st.sample_context(DOCS, 4, seed=0)
    assert len(set(sampled)) == 4
    assert sorted(cde_st.sample_context(DOCS[:3], 7, seed=0)).count(DOCS[0]) in (2, 3)
    # the document prompt is part of what is embedded
    assert model.set_context(DOCS, seed=0, prompt="").fingerprint != a


def test_context_vectors_override_matches_set_context(make_tiny_cde):
    model = make_tiny_cde(context_size=8)
    vectors = model.embed_context(DOCS, seed=2)
    assert vectors.shape == (8, 32)
    model.set_context(DOCS, seed=2)
    active = model.encode_document(DOCS)
    model.set_context(DOCS[:2], seed=0)  # a different active context is overridden per call
    np.testing.assert_allclose(model.encode_document(DOCS, context_vectors=vectors), active, atol=1e-6)
    # the released models' name for the same argument
    np.testing.assert_allclose(model.encode(DOCS, dataset_embeddings=vectors), active, atol=1e-6)
    with pytest.raises(TypeError, match="both context_vectors= and dataset_embeddings="):
        model.encode(DOCS, context_vectors=vectors, dataset_embeddings=vectors)
    model.set_context(vectors)
    assert model.context_info.source == "vectors"
    np.testing.assert_allclose(model.encode_document(DOCS), active, atol=1e-6)


def test_sequence_dropout_only_in_training(make_tiny_cde):
    model = make_tiny_cde(context_size=8, sequence_dropout=0.999)
    module = model.contextual_module
    ctx = _vectors(model, 8)
    features = module.preprocess(DOCS[:2])
    with torch.no_grad():
        evald = module(dict(features), context_vectors=ctx)["sentence_embedding"]
        null = module(dict(features), context_vectors=module.null_vector.expand(8, -1))["sentence_embedding"]
        module.train()
        torch.manual_seed(0)
        dropped = module(dict(features), context_vectors=ctx)["sentence_embedding"]
        module.eval()
    torch.testing.assert_close(dropped, null, atol=1e-5, rtol=1e-5)
    assert (evald - null).abs().max() > 1e-3


def test_bad_inputs_raise_clear_errors(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    with pytest.raises(ValueError, match="empty"):
        model.set_context([])
    with pytest.raises(TypeError, match="only strings"):
        model.set_context(["ok", 3])
    with pytest.raises(TypeError, match="single string"):
        model.set_context("a corpus as one string")
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        model.set_context(torch.zeros(4, 16))
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        model.encode_document(DOCS, context_vectors=torch.zeros(32))
    with pytest.raises(ValueError, match="NaN"):
        model.set_context(torch.full((4, 32), float("nan")))
    with pytest.raises(ValueError, match="context_size=4"):
        model.set_context(np.zeros((5, 32), dtype=np.float32))
    with pytest.raises(ValueError, match="ContextualTransformer as first module"):
        ContextualSentenceTransformer(modules=[torch.nn.Identity()])
    with pytest.raises(FileNotFoundError):
        ContextualSentenceTransformer.from_encoder("/nonexistent/encoder")


@pytest.mark.slow
def test_minilm_with_empty_context_equals_plain_minilm(minilm):
    """J = 0, no prompts, identity output head: the contextual model is exactly the pretrained bi-encoder."""
    base = SentenceTransformer(minilm)
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=0, prompts={})
    assert model.max_seq_length == base.max_seq_length == 256
    expected = base.encode(DOCS)
    got = model.encode_document(DOCS)  # MiniLM ends with Normalize, and so does the model built from it
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_from_encoder_keeps_the_source_normalisation(minilm, tiny_bert_dir, tmp_path):
    """Unit-length output exactly when the source sentence-transformers model normalises (k-means clustering and
    logistic-regression classification see the norms), or when asked; the choice survives save/load."""
    from sentence_transformers.base.modules import Normalize

    normalised = ContextualSentenceTransformer.from_encoder(minilm, context_size=2, prompts={})
    assert isinstance(normalised[-1], Normalize)
    norms = np.linalg.norm(normalised.encode(DOCS[:3]), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    normalised.save(str(tmp_path / "m"))
    assert isinstance(ContextualSentenceTransformer(str(tmp_path / "m"))[-1], Normalize)

    raw = ContextualSentenceTransformer.from_encoder(minilm, context_size=2, prompts={}, normalize=False)
    assert len(raw) == 1
    assert np.linalg.norm(raw.encode(DOCS[:3]), axis=1).min() > 1.5  # MiniLM's mean-pooled norms are ~3-7
    # A plain HF folder has no sentence-transformers pipeline: mean pooling, no Normalize (as SentenceTransformer).
    assert len(ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=2)) == 1
    assert len(ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=2, normalize=True)) == 2


def test_from_encoder_warns_on_a_source_that_does_not_mean_pool(tiny_bert_dir, tmp_path):
    """The second stage mean-pools: a CLS-pooling source would silently not be reproduced at step 0."""
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(tiny_bert_dir)
    cls_source = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "cls")])
    cls_source.save(str(tmp_path / "cls"))
    with pytest.warns(UserWarning, match="pools with 'cls'"):
        model = ContextualSentenceTransformer.from_encoder(str(tmp_path / "cls"), context_size=2)
    assert len(model) == 1


@pytest.mark.slow
def test_minilm_contextual_retrieval_sanity(minilm):
    """Untrained (context head initialised in M2's input space), a MiniLM-based CDE still ranks sensibly."""
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=16, prompts={})
    model.set_context(DOCS, seed=0)
    q = model.encode_query(["why does it rain?", "which drink keeps you awake?"])
    d = model.encode_document(DOCS)
    top = model.similarity(q, d).argmax(1).tolist()
    assert top == [1, 8]


def test_every_set_context_route_uses_the_same_prompt(make_tiny_cde, tmp_path):
    """ContextualSentenceTransformer.set_context, cde_st.set_context(model) and model[0].set_context give the same
    context for a model with custom prompts (and so do the routes on a plainly loaded copy)."""
    model = make_tiny_cde(context_size=4, prompts={"query": "q: ", "document": "passage: "})
    routes = [
        lambda m: m.set_context(DOCS, seed=0),
        lambda m: cde_st.set_context(m, DOCS, seed=0),
        lambda m: m[0].set_context(DOCS, seed=0),
    ]
    fingerprints, embeddings = set(), []
    for route in routes:
        info = route(model)
        assert info.prompt == "passage: "
        fingerprints.add(info.fingerprint)
        embeddings.append(model.encode_document(DOCS[:3]))
    assert len(fingerprints) == 1
    assert all(np.array_equal(e, embeddings[0]) for e in embeddings)
    no_prompts = make_tiny_cde(context_size=4, prompts={})
    assert no_prompts.set_context(DOCS).prompt == "" == no_prompts[0].set_context(DOCS).prompt
    model.save(str(tmp_path / "m"))
    plain = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True)
    assert cde_st.set_context(plain, DOCS).fingerprint == plain[0].set_context(DOCS).fingerprint == fingerprints.pop()


def test_multi_process_pool_uses_the_current_context(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    pool = model.start_multi_process_pool(["cpu", "cpu"])
    try:
        model.set_context(DOCS[:4])  # set after the workers copied the model
        expected = model.encode_document(DOCS)
        np.testing.assert_allclose(model.encode_document(DOCS, pool=pool), expected, atol=1e-6)
        model.clear_context()
        with pytest.warns(UserWarning, match="No context is set"):
            null = model.encode_document(DOCS)
        np.testing.assert_allclose(model.encode_document(DOCS, pool=pool), null, atol=1e-6)
    finally:
        model.stop_multi_process_pool(pool)


def test_context_follows_first_stage_changes(make_tiny_cde, tmp_path):
    """A context set before training is re-embedded from its documents once the first stage changed (never used
    or saved stale); vectors given directly cannot be, and a warning says so."""
    model = make_tiny_cde(context_size=4)
    module = model.contextual_module
    info = model.set_context(DOCS, seed=0)
    old = module.context_vectors.clone()
    with torch.no_grad():
        for param in module.first_stage.parameters():
            param.mul_(1.1)  # what an optimiser step does: in place
    got = model.encode_document(DOCS[:3])
    fresh = model.embed_context(DOCS, seed=0)
    assert not torch.allclose(old, fresh)
    assert torch.allclose(module.context_vectors, fresh, atol=1e-6)  # recomputed from the same documents
    assert model.context_info.fingerprint == info.fingerprint
    np.testing.assert_allclose(got, model.encode_document(DOCS[:3], context_vectors=fresh), atol=1e-6)
    # saved with its documents: after loading and changing the first stage again, it is re-embedded again
    model.save(str(tmp_path / "m"))
    loaded = ContextualSentenceTransformer(str(tmp_path / "m"))
    with torch.no_grad():
        for param in loaded.contextual_module.first_stage.parameters():
            param.mul_(0.9)
    loaded.encode_document(DOCS[:1])
    assert torch.allclose(loaded.contextual_module.context_vectors, loaded.embed_context(DOCS, seed=0), atol=1e-6)
    # vectors given directly: a warning, not a silent stale context
    model.set_context(fresh)
    with torch.no_grad():
        next(module.first_stage.parameters()).add_(0.5)
    with pytest.warns(UserWarning, match="may be stale"):
        model.encode_document(DOCS[:1])


@pytest.mark.slow
@pytest.mark.parametrize("context_size", [64, 512])
def test_untrained_from_encoder_starts_as_its_source(minilm, context_size):
    """by default an untrained model built from an encoder gives that encoder's embeddings whatever the
    context (zero-initialised context gate), also at J = 512 where the paper's joint attention collapses."""
    base = SentenceTransformer(minilm)
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=context_size)
    module = model.contextual_module
    assert (module.context_attention, module.context_gate, module.context_layers) == ("cached", True, [3, 4, 5])
    for context in (DOCS, [d.upper() for d in DOCS[::-1]]):
        model.set_context(context, seed=1)
        np.testing.assert_allclose(model.encode_query(DOCS), base.encode(DOCS, prompt="search_query: "), atol=1e-5)
        np.testing.assert_allclose(
            model.encode_document(DOCS), base.encode(DOCS, prompt="search_document: "), atol=1e-5
        )
    # The paper's joint attention is one argument away, with the paper's heads.
    joint = ContextualSentenceTransformer.from_encoder(minilm, context_size=2, context_attention="joint")
    module = joint.contextual_module
    assert (module.context_attention, module.context_gate, module.context_layers) == ("joint", False, None)
    assert (module.output_head, module.first_stage_head) == ("residual_mlp", "mlp")


def test_folders_keep_their_attention_when_loaded(make_tiny_cde, tiny_bert_dir, tmp_path):
    """The from_encoder default changed, the ContextualTransformer defaults did not: a folder saved with joint
    attention (or by code older than the attention fields) loads as joint; a gated one loads gated."""
    import json

    joint = make_tiny_cde(context_size=4, context_attention="joint")
    joint.set_context(DOCS, seed=0)
    expected = joint.encode_document(DOCS[:3])
    joint.save(str(tmp_path / "joint"))
    config_path = tmp_path / "joint" / "cde_config.json"
    config = json.loads(config_path.read_text())
    for key in ("context_attention", "context_gate", "context_layers"):
        config.pop(key)  # as written before these fields existed
    config_path.write_text(json.dumps(config))
    loaded = ContextualSentenceTransformer(str(tmp_path / "joint")).contextual_module
    assert (loaded.context_attention, loaded.context_gate, loaded.gates) == ("joint", False, None)
    np.testing.assert_allclose(
        ContextualSentenceTransformer(str(tmp_path / "joint")).encode_document(DOCS[:3]), expected, atol=1e-6
    )

    gated = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=4)
    gated.save(str(tmp_path / "gated"))
    module = ContextualSentenceTransformer(str(tmp_path / "gated")).contextual_module
    assert (module.context_attention, module.context_gate, module.context_layers) == ("cached", True, [0, 1])


def test_encode_after_set_context_embeds_like_encode_document(make_tiny_cde, tmp_path):
    """plain encode() after set_context used no prompt while encode_document used its own (and the
    context documents got it): encode() now embeds as a document, on every loading route."""
    model = make_tiny_cde(context_size=4, prompts={"query": "q: ", "document": "passage: "})
    model.set_context(DOCS, seed=0)
    document = model.encode_document(DOCS[:3])
    assert model.default_prompt_name == "document"
    np.testing.assert_array_equal(model.encode(DOCS[:3]), document)
    assert not np.allclose(model.encode(DOCS[:3], prompt=""), document, atol=1e-4)  # no prompt, when asked
    assert not np.allclose(model.encode_query(DOCS[:3]), document, atol=1e-4)
    model.save(str(tmp_path / "m"))
    for loaded in (
        ContextualSentenceTransformer(str(tmp_path / "m")),
        SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True),
    ):
        np.testing.assert_allclose(loaded.encode(DOCS[:3]), document, atol=1e-6)
    assert make_tiny_cde(context_size=4, prompts={}).default_prompt_name is None


def test_module_set_context_follows_the_model_prompts(make_tiny_cde, tmp_path):
    """model.prompts is the source of truth for the context documents' prompt: model[0].set_context uses the
    document prompt the model has now, not the one it was built or loaded with (on both loading routes)."""
    model = make_tiny_cde(context_size=4, prompts={"query": "q: ", "document": "passage: "})
    model.prompts = {"query": "q: ", "document": "doc: "}
    assert model[0].set_context(DOCS, seed=0).prompt == "doc: "
    assert model.set_context(DOCS, seed=0).prompt == "doc: "
    model.prompts["document"] = "text: "  # edited in place
    assert model[0].set_context(DOCS, seed=0).prompt == "text: " == model[0].embed_context(DOCS)[1].prompt
    model.save(str(tmp_path / "m"))
    for loaded in (
        ContextualSentenceTransformer(str(tmp_path / "m")),
        SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True),
    ):
        loaded.prompts["document"] = "other: "
        assert loaded[0].set_context(DOCS, seed=0).prompt == "other: "
        del loaded.prompts["document"]
        assert loaded[0].set_context(DOCS, seed=0).prompt == ""


def test_setting_a_module_prompt_inside_a_model_is_not_a_silent_no_op(make_tiny_cde):
    """The module reads model.prompts, so setting its prompt must write there (else the value is ignored)."""
    model = make_tiny_cde(context_size=4, prompts={"query": "q: ", "document": "passage: "})
    model[0].document_prompt = "doc: "
    model[0].query_prompt = "query: "
    assert model.prompts["document"] == "doc: " and model.prompts["query"] == "query: "
    assert model[0].set_context(DOCS, seed=0).prompt == "doc: "


def test_mteb_describes_a_contextual_model_without_a_deprecation_warning(make_tiny_cde):
    """mteb builds a ModelMeta from a SentenceTransformer with get_sentence_embedding_dimension (a FutureWarning in
    sentence-transformers 6): direct mteb use of a CDE model must not print it on every evaluation."""
    from mteb.models.model_meta import ModelMeta

    model = make_tiny_cde(context_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        meta = ModelMeta._from_sentence_transformer_model(model)
    assert meta.embed_dim == model.get_embedding_dimension()


def test_null_context_warning_points_at_the_callers_line(make_tiny_cde, tmp_path):
    """The warning is attributed to the line that encodes (not to torch's module.py), on every route."""
    model = make_tiny_cde(context_size=4)
    with pytest.warns(UserWarning, match="No context is set") as record:
        model.encode_document(DOCS[:2])
    assert [w.filename for w in record if "No context" in str(w.message)] == [__file__]
    model.save(str(tmp_path / "m"))
    plain = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True)
    with pytest.warns(UserWarning, match="No context is set") as record:
        plain.encode(DOCS[:2])
    assert [w.filename for w in record if "No context" in str(w.message)] == [__file__]
    plain[0].clear_context()  # warns once per context: again
    with pytest.warns(UserWarning, match="No context is set") as record:
        plain[0](plain[0].preprocess(DOCS[:2]))  # the module called directly
    assert [w.filename for w in record if "No context" in str(w.message)] == [__file__]
