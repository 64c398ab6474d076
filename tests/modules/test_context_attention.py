"""cde_st's own attention modes between text and context: the cached context (context attends only to context)
and the zero-initialised context gate (an untrained model is its encoder)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS
from sentence_transformers import SentenceTransformer

from cde_st import ContextualSentenceTransformer
from cde_st.modules.context_attention import context_slots

DOCS = SHORT_DOCS


def _uncached_reference(
    model, texts: list[str], context: torch.Tensor, read_layers=None, context_mask=None, prompt=None
) -> torch.Tensor:
    """The cached mode computed without any cache or split path: HF's own encoder layers over [context ; text] with
    a 4-D mask in which context rows see only context rows (and, outside ``read_layers``, text rows only text);
    ``context_mask`` (B, J) hides context slots from a row's text."""
    module = model.contextual_module
    if prompt is None:  # as encode(): its default prompt (the document prompt for a model that has one)
        prompt = model.prompts.get(model.default_prompt_name or "", "")
    features = module.preprocess(texts, prompt=prompt)
    ids, mask = features["input_ids"], features["attention_mask"]
    text = module.second_adapter.embed_tokens(module.second_stage, ids, features.get("token_type_ids"))
    prefix = context_slots(context.to(text.dtype), module.null_vector.to(text.dtype), module.config, training=False)
    batch, p, length = ids.shape[0], prefix.shape[0], ids.shape[1]
    hidden = torch.cat([prefix.unsqueeze(0).expand(batch, -1, -1), text], dim=1)
    keys_valid = torch.cat([mask.new_ones(batch, p), mask], dim=1).bool()[:, None, None, :]
    rows = torch.arange(p + length)
    allowed = (rows[:, None] >= p) | (rows[None, :] < p)  # text rows see all; context rows only context
    text_only = (rows[:, None] >= p) == (rows[None, :] >= p)  # context rows see context, text rows text
    hidden_slots = torch.zeros(batch, 1, p + length, p + length, dtype=torch.bool)
    if context_mask is not None:  # text rows (queries >= p) may not read the hidden slots (keys < len(context))
        hidden_slots[:, 0, p:, : context_mask.shape[1]] = ~context_mask[:, None, :]
    for i, layer in enumerate(module.second_stage.encoder.layer):
        reads = read_layers is None or i in read_layers
        hidden = layer(
            hidden, attention_mask=keys_valid & (allowed if reads else text_only)[None, None] & ~hidden_slots
        )
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    out = hidden[:, p:]
    pooled = (out * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    return module.head(pooled)


@pytest.mark.parametrize("num_context", [0, 3, 8])
def test_cached_mode_equals_uncached_computation(make_tiny_cde, num_context):
    model = make_tiny_cde(context_size=8, context_attention="cached")
    context = torch.randn(num_context, model.contextual_module.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _uncached_reference(model, DOCS, context)
    if num_context:
        model.set_context(context)
    else:
        model.clear_context()
    first = model.encode(DOCS, convert_to_tensor=True)  # builds the cache
    assert model.contextual_module.context_cache_bytes() > 0
    second = model.encode(DOCS, convert_to_tensor=True, batch_size=2)  # reuses it
    per_call = model.encode(DOCS, convert_to_tensor=True, context_vectors=context) if num_context else first
    assert (first - expected).abs().max() <= 1e-5
    assert (second - first).abs().max() <= 1e-6
    assert (per_call - first).abs().max() <= 1e-6


@pytest.mark.parametrize("layers", [[0], [-1]])
def test_context_layers_cached_equals_uncached_computation(make_tiny_cde, layers):
    """Text rows read the context only in ``context_layers``; the cache keeps only those layers' keys/values."""
    model = make_tiny_cde(context_size=8, context_attention="cached", context_layers=layers)
    module = model.contextual_module
    assert module.context_layers == sorted(i % 2 for i in layers)
    context = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _uncached_reference(model, DOCS, context, read_layers=module.context_layers)
        every_layer = _uncached_reference(model, DOCS, context)
    model.set_context(context)
    got = model.encode(DOCS, convert_to_tensor=True)
    assert (got - expected).abs().max() <= 1e-5
    assert (got - every_layer).abs().max() > 1e-4  # the layers that do not read make a difference
    full = make_tiny_cde(context_size=8, context_attention="cached")
    full.set_context(context)
    full.encode(DOCS[:1])
    ratio = module.context_cache_bytes() / full.contextual_module.context_cache_bytes()
    assert ratio == len(module.context_layers) / 2


def _row_masks(batch: int, slots: int) -> torch.Tensor:
    """(B, J) visibility: row i hides slot i (leave-one-out), the last row hides every slot, the first sees all."""
    mask = torch.ones(batch, slots, dtype=torch.bool)
    mask[torch.arange(1, batch), torch.arange(1, batch) % slots] = False
    mask[-1] = False
    return mask


def test_context_mask_cached_equals_uncached_computation(make_tiny_cde):
    """Per-row hidden slots in cached mode: HF's own layers with the same slots cut from each row's text keys."""
    model = make_tiny_cde(context_size=8, context_attention="cached")
    module = model.contextual_module
    context = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(1))
    mask = _row_masks(len(DOCS), 8)
    features = module.preprocess(DOCS)
    with torch.no_grad():
        expected = _uncached_reference(model, DOCS, context, context_mask=mask, prompt="")
        got = module(dict(features), context_vectors=context, context_mask=mask)["sentence_embedding"]
        unmasked = module(dict(features), context_vectors=context)["sentence_embedding"]
        all_visible = module(dict(features), context_vectors=context, context_mask=torch.ones_like(mask))
    assert (got - expected).abs().max() <= 1e-5
    assert (all_visible["sentence_embedding"] - unmasked).abs().max() <= 1e-6
    assert (got[0] - unmasked[0]).abs().max() <= 1e-6  # the first row sees every slot
    assert (got[1:] - unmasked[1:]).abs().max(dim=1).values.min() > 1e-5  # every other row hides one


MASK_MODES = {
    "joint": {},
    "joint-gate": {"context_gate": True},
    "cached-layer-0": {"context_attention": "cached", "context_layers": [0]},
    "cached-gate-layer-0": {"context_attention": "cached", "context_gate": True, "context_layers": [0]},
}


@pytest.mark.parametrize("mode", sorted(MASK_MODES))
def test_hidden_slot_does_not_reach_the_row(make_tiny_cde, mode):
    """A row's embedding does not depend on a slot hidden from it (in cached mode only where the context is read
    before the context rows attend to each other, i.e. layer 0), and does depend on the slots it sees."""
    model = make_tiny_cde(context_size=6, sequence_dropout=0.0, **MASK_MODES[mode])
    module = model.contextual_module
    if module.gates is not None:
        with torch.no_grad():
            module.gates.fill_(0.5)
    gen = torch.Generator().manual_seed(2)
    context = torch.randn(5, module.hidden_size, generator=gen)  # 5 vectors + 1 null slot
    mask = _row_masks(len(DOCS), 5)
    moved = context.clone()
    moved[3] += torch.randn(module.hidden_size, generator=gen)
    features = module.preprocess(DOCS)
    with torch.no_grad():
        before = module(dict(features), context_vectors=context, context_mask=mask)["sentence_embedding"]
        after = module(dict(features), context_vectors=moved, context_mask=mask)["sentence_embedding"]
    change = (after - before).abs().max(dim=1).values
    hides = ~mask[:, 3]
    assert change[hides].max() <= 1e-6
    assert change[~hides].min() > 1e-5


@pytest.mark.parametrize("attention", ["joint", "cached"])
def test_gated_row_that_hides_every_slot_reads_nothing(make_tiny_cde, attention):
    """With the gate, a row that may read no slot is its encoder's text-only embedding, with finite gradients."""
    model = make_tiny_cde(context_size=4, context_gate=True, context_attention=attention, output_head="none")
    module = model.contextual_module
    with torch.no_grad():
        module.gates.fill_(0.7)
    context = torch.randn(4, module.hidden_size, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1] = False
    features = module.preprocess(DOCS[:2])
    out = module(dict(features), context_vectors=context.requires_grad_(), context_mask=mask)["sentence_embedding"]
    out.sum().backward()
    assert torch.isfinite(context.grad).all() and all(
        torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None
    )
    with torch.no_grad():
        module.gates.zero_()
        text_only = module(dict(features), context_vectors=context.detach())["sentence_embedding"]
    assert (out[1].detach() - text_only[1]).abs().max() <= 1e-5
    assert (out[0].detach() - text_only[0]).abs().max() > 1e-4


def test_context_mask_is_checked(make_tiny_cde):
    model = make_tiny_cde(context_size=4, context_attention="cached")
    module = model.contextual_module
    features = module.preprocess(DOCS[:2])
    context = torch.randn(3, module.hidden_size)
    with pytest.raises(ValueError, match="context_mask must be"):
        module(dict(features), context_vectors=context, context_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs the context"):
        module(dict(features), context_mask=torch.ones(2, 3, dtype=torch.bool))


def test_context_layers_are_checked(make_tiny_cde):
    for bad in ([2], [-3], [], ["zero"], [0.5], "top"):
        with pytest.raises(ValueError, match="context_layers"):
            make_tiny_cde(context_size=8, context_attention="cached", context_layers=bad)
    # the one coercion rule: the text of a whole number is that number
    assert make_tiny_cde(
        context_size=8, context_attention="cached", context_layers=["0"]
    ).contextual_module.context_layers == [0]
    with pytest.raises(ValueError, match="context_layers needs"):
        make_tiny_cde(context_size=8, context_layers=[1])  # joint attention without gate: every layer reads
    gated = make_tiny_cde(context_size=8, context_gate=True, context_layers=[1])  # joint + gate: allowed
    assert gated.contextual_module.context_layers == [1]


def test_cached_mode_contracts(make_tiny_cde, tmp_path):
    model = make_tiny_cde(context_size=8, context_attention="cached")
    ctx = torch.randn(8, model.contextual_module.hidden_size, generator=torch.Generator().manual_seed(0))
    a = model.encode_document(DOCS, context_vectors=ctx)
    np.testing.assert_allclose(a, model.encode_document(DOCS, context_vectors=ctx[torch.randperm(8)]), atol=1e-5)
    assert np.abs(a - model.encode_document(DOCS, context_vectors=ctx[:4])).max() > 1e-4
    alone = np.stack([model.encode_document([d], context_vectors=ctx)[0] for d in DOCS])
    np.testing.assert_allclose(alone, a, atol=1e-5)
    model.set_context(DOCS, seed=0)
    before = model.encode_query(DOCS)
    model.save(str(tmp_path / "m"))
    reloaded = ContextualSentenceTransformer(str(tmp_path / "m"))
    assert reloaded.contextual_module.context_attention == "cached"
    assert np.abs(reloaded.encode_query(DOCS) - before).max() == 0


def test_cache_follows_context_and_weights(make_tiny_cde):
    model = make_tiny_cde(context_size=8, context_attention="cached")
    module = model.contextual_module
    model.set_context(DOCS[:3])
    a = model.encode(DOCS)
    model.set_context(DOCS[3:])
    b = model.encode(DOCS)
    assert np.abs(a - b).max() > 1e-4  # a new context is never served from the old cache
    with torch.no_grad():
        for param in module.second_stage.parameters():
            param.add_(0.01)
    model.train()  # a training step invalidates the cache ...
    model.eval()
    c = model.encode(DOCS)
    fresh = model.encode(DOCS, context_vectors=module.context_vectors)
    np.testing.assert_allclose(c, fresh, atol=1e-6)  # ... so the cache matches the new weights
    module.load_state_dict(module.state_dict())
    assert module.context_cache_bytes() == 0


@pytest.mark.parametrize("attention", ["joint", "cached"])
def test_zero_gate_is_exactly_the_encoder(make_tiny_cde, attention):
    """With the gate at zero, the context (none, partial or full) changes nothing; a non-zero gate does."""
    model = make_tiny_cde(context_size=8, context_attention=attention, context_gate=True)
    plain = make_tiny_cde(context_size=0)  # same seed -> same second-stage weights and head
    module = model.contextual_module
    expected = plain.encode(DOCS)
    for n in (0, 3, 8):
        ctx = torch.randn(n, module.hidden_size, generator=torch.Generator().manual_seed(n))
        got = model.encode(DOCS, context_vectors=ctx) if n else model.encode(DOCS)
        assert np.abs(got - expected).max() <= 1e-5
    with torch.no_grad():
        module.gates.fill_(0.5)
    assert np.abs(model.encode(DOCS, context_vectors=ctx) - expected).max() > 1e-4


def test_gate_gets_gradient_at_zero(make_tiny_cde):
    model = make_tiny_cde(context_size=8, context_gate=True, context_attention="cached")
    module = model.contextual_module
    module.train()
    features = module.preprocess(DOCS)
    ctx = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(0))
    out = module(features, context_vectors=ctx)["sentence_embedding"]
    out.pow(2).sum().backward()
    assert module.gates.grad is not None and module.gates.grad.abs().sum() > 0


def test_modes_need_a_supported_backbone(make_tiny_cde):
    with pytest.raises(ValueError, match="context_attention"):
        make_tiny_cde(context_attention="both")


def test_gated_minilm_starts_as_minilm(minilm):
    """The issue's step-0 test: from all-MiniLM-L6-v2 with the gate, empty / partial / full context -> MiniLM."""
    base = SentenceTransformer(minilm)
    expected = base.encode(DOCS)
    for attention in ("cached", "joint"):
        model = ContextualSentenceTransformer.from_encoder(
            minilm, context_size=8, prompts={}, context_gate=True, context_attention=attention
        )
        model.eval()
        assert np.abs(model.encode(DOCS) - expected).max() <= 1e-5
        model.set_context(DOCS[:3])  # partial: 3 real documents tiled to 8 slots
        assert np.abs(model.encode(DOCS) - expected).max() <= 1e-5
        partial = model.embed_context(DOCS)[:5]  # 5 real vectors + 3 null slots
        got = model.encode(DOCS, context_vectors=partial)
        assert np.abs(got - expected).max() <= 1e-5


def test_the_cache_is_an_owned_object_dropped_with_the_context(make_tiny_cde):
    model = make_tiny_cde(context_size=4, context_attention="cached")
    module = model.contextual_module
    model.set_context(DOCS)
    model.encode(DOCS)
    assert module.context_cache.nbytes() == module.context_cache_bytes() > 0
    model.set_context(DOCS[:2])  # another context: the keys/values of the old one go
    assert module.context_cache.entry is None and module.context_cache_bytes() == 0


@pytest.mark.parametrize("gate", [False, True])
def test_cache_follows_autocast(make_tiny_cde, gate):
    """Keys/values computed under bf16 autocast are bf16: a float32 forward after them recomputes them (it used to
    reuse them and fail, or a bf16 forward reused float32 ones), and each gives what a fresh cache gives."""
    model = make_tiny_cde(context_size=4, context_attention="cached", context_gate=gate)
    model.set_context(DOCS, seed=0)
    fresh_fp32 = model.encode_document(DOCS[:5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first_bf16 = model.encode_document(DOCS[:5])
    assert model.contextual_module.context_cache.entry[2][-1][0].dtype == torch.bfloat16
    after_bf16 = model.encode_document(DOCS[:5])
    np.testing.assert_allclose(after_bf16, fresh_fp32, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again_bf16 = model.encode_document(DOCS[:5])
    np.testing.assert_allclose(again_bf16, first_bf16, atol=1e-6)


def test_centred_context_rows_keep_what_sets_each_row_apart():
    from cde_st.modules.context_attention import centred_rows
    from cde_st.modules.contextual_config import ContextualConfig

    generator = torch.Generator().manual_seed(0)
    shared = 5 * torch.randn(1, 16, generator=generator)  # what every row of one corpus shares
    rows = shared + torch.randn(6, 16, generator=generator)
    out = centred_rows(rows)
    torch.testing.assert_close(out.norm(dim=-1), rows.norm(dim=-1).mean().expand(6))  # the rows' scale kept
    assert torch.nn.functional.cosine_similarity(rows[:1], rows[1:]).min() > 0.8  # near-identical as given
    assert torch.nn.functional.cosine_similarity(out[:1], out[1:]).max() < 0.5  # told apart once centred
    moved = centred_rows(rows + 3 * torch.randn(1, 16, generator=generator))  # another shared part: same rows
    torch.testing.assert_close(torch.nn.functional.cosine_similarity(moved, out), torch.ones(6))
    config = ContextualConfig(context_size=8, context_attention="cached", context_gate=True, context_centering=True)
    null = torch.zeros(16)
    torch.testing.assert_close(context_slots(rows, null, config, training=False)[:6], out)
    torch.testing.assert_close(context_slots(rows[:1], null, config, training=False)[0], rows[0])  # one row: as is
    plain = ContextualConfig(context_size=8, context_attention="cached", context_gate=True)
    torch.testing.assert_close(context_slots(rows, null, plain, training=False)[:6], rows)


def test_given_vectors_compute_their_keys_values_once_and_follow_the_weights(make_tiny_cde, monkeypatch):
    # A pool worker gets the context as vectors with every chunk: their keys/values are kept like the active
    # context's, and compared with the weights at every such forward (no once-per-call check covers them).
    model = make_tiny_cde(context_size=8, context_attention="cached")
    module = model.contextual_module
    vectors = torch.randn(6, module.hidden_size)
    adapter = module.second_adapter
    computed = []
    states = adapter.context_states
    monkeypatch.setattr(adapter, "context_states", lambda *a, **k: computed.append(1) or states(*a, **k))
    first = model.encode(DOCS, context_vectors=vectors, batch_size=2)
    again = model.encode(DOCS, context_vectors=vectors.clone(), batch_size=2)
    assert len(computed) == 1 and np.array_equal(first, again)
    other = model.encode(DOCS, context_vectors=vectors + 0.5, batch_size=2)
    assert len(computed) == 2 and np.abs(other - first).max() > 1e-4
    for param in module.second_stage.parameters():
        param.data += 0.01  # an edit no version counter records
    edited = model.encode(DOCS, context_vectors=vectors, batch_size=2)
    assert len(computed) == 3
    monkeypatch.undo()
    module.context_cache.drop()
    np.testing.assert_array_equal(edited, model.encode(DOCS, context_vectors=vectors, batch_size=2))
