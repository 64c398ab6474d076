"""The backbone seam (cde_st/modules/backbone.py): per family, the split attention paths reduce to the plain encoder
when the context is gated off, prefix rows carry no position (the context is a set), and the cached keys/values stop
at the last layer that reads them."""

from __future__ import annotations

import pytest
import torch

from cde_st.modules.backbone import NO_POSITION, get_adapter
from cde_st.modules.encoders import build_encoder

HIDDEN, HEADS, LENGTH, PREFIX = 32, 2, 10, 5
CONFIGS = {
    "bert": dict(
        model_type="bert",
        vocab_size=100,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    # Three layers with a global layer every second one: a sliding-window layer sits between two global ones.
    "modernbert": dict(
        model_type="modernbert",
        vocab_size=100,
        hidden_size=HIDDEN,
        num_hidden_layers=3,
        num_attention_heads=HEADS,
        intermediate_size=64,
        global_attn_every_n_layers=2,
        local_attention=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
}


@pytest.fixture(params=sorted(CONFIGS))
def encoder(request):
    torch.manual_seed(0)
    model = build_encoder(CONFIGS[request.param], "sdpa").eval()
    ids = torch.randint(3, 100, (3, LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, LENGTH, dtype=torch.long)
    mask[1, 7:] = 0  # one padded row
    context = torch.randn(PREFIX, HIDDEN, generator=torch.Generator().manual_seed(2))
    return get_adapter(request.param), model, ids, mask, context


def test_unknown_family_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"'gpt2' is not supported yet; supported: .*'bert'.*'modernbert'"):
        get_adapter("gpt2")


@torch.no_grad()
def test_zero_gates_give_the_plain_encoder(encoder):
    adapter, model, ids, mask, context = encoder
    plain = adapter.forward(model, ids, mask)
    text = adapter.embed_tokens(model, ids, None)
    states = adapter.context_states(model, context)
    gates = torch.zeros(len(states), HEADS)
    for cached in (states, None):  # the cached and the joint split paths
        split = adapter.encode_split(model, context, text, mask, cached, gates)
        torch.testing.assert_close(split[mask.bool()], plain[mask.bool()], rtol=0, atol=1e-5)
    opened = adapter.encode_split(model, context, text, mask, states, torch.full_like(gates, 0.5))
    assert (opened - plain)[mask.bool()].abs().max() > 1e-3  # an open gate reads the context


@torch.no_grad()
def test_prefix_rows_are_a_set(encoder):
    adapter, model, ids, mask, context = encoder
    text = adapter.embed_tokens(model, ids, None)
    positions = torch.cat([torch.full((PREFIX,), NO_POSITION), torch.arange(LENGTH)])
    joint_mask = torch.cat([torch.ones(3, PREFIX, dtype=torch.long), mask], dim=1)

    def text_rows(prefix):
        hidden = torch.cat([prefix.expand(3, -1, -1), text], dim=1)
        return adapter.encode(model, hidden, joint_mask, positions, PREFIX)[:, PREFIX:][mask.bool()]

    torch.testing.assert_close(text_rows(context.flip(0)), text_rows(context), rtol=0, atol=1e-5)
    plain = adapter.forward(model, ids, mask)[mask.bool()]
    assert (text_rows(context) - plain).abs().max() > 1e-3  # the prefix is read


@torch.no_grad()
def test_cached_states_stop_at_the_last_reading_layer(encoder):
    adapter, model, _, _, context = encoder
    every = adapter.context_states(model, context)
    assert len(every) == len(adapter._layers(model))
    assert all(k.shape == (1, HEADS, PREFIX, HIDDEN // HEADS) for k, _ in every)
    some = adapter.context_states(model, context, read_layers=[0])
    assert len(some) == 1 and some[0] is not None
    torch.testing.assert_close(some[0][0], every[0][0])


@torch.no_grad()
def test_a_row_that_may_read_no_slot_reads_nothing(encoder):
    adapter, model, ids, mask, context = encoder
    text = adapter.embed_tokens(model, ids, None)
    states = adapter.context_states(model, context)
    gates = torch.full((len(states), HEADS), 0.5)
    prefix_mask = torch.ones(3, PREFIX, dtype=torch.bool)
    prefix_mask[0] = False  # row 0 may read no context slot
    masked = adapter.encode_split(model, context, text, mask, states, gates, prefix_mask=prefix_mask)
    plain = adapter.forward(model, ids, mask)
    torch.testing.assert_close(masked[0], plain[0], rtol=0, atol=1e-5)
    full = adapter.encode_split(model, context, text, mask, states, gates)
    torch.testing.assert_close(masked[1:][mask[1:].bool()], full[1:][mask[1:].bool()], rtol=0, atol=1e-6)


@torch.no_grad()
def test_the_sink_lets_the_read_count_matching_context_rows(encoder):
    # Without the sink the read is a weighted mean of the context rows, so a context and the same context twice
    # read the same: how many rows match a token is normalised away. With it, twice the rows read more.
    adapter, model, ids, mask, context = encoder
    text = adapter.embed_tokens(model, ids, None)
    once, twice = context[:2], torch.cat([context[:2], context[:2]])
    gates = torch.full((len(adapter._layers(model)), HEADS), 0.5)

    def read(prefix, sink):
        states = adapter.context_states(model, prefix)
        return adapter.encode_split(model, prefix, text, mask, states, gates, sink=sink)[mask.bool()]

    torch.testing.assert_close(read(twice, False), read(once, False), rtol=0, atol=1e-5)
    assert (read(twice, True) - read(once, True)).abs().max() > 1e-4  # 20x the tolerance above
    plain = adapter.forward(model, ids, mask)[mask.bool()]
    zero = adapter.encode_split(
        model, once, text, mask, adapter.context_states(model, once), torch.zeros_like(gates), sink=True
    )
    torch.testing.assert_close(zero[mask.bool()], plain, rtol=0, atol=1e-5)  # a closed gate: still the encoder
