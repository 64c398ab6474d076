"""The small parts around the encoders (cde_st/modules/heads.py): masked mean pooling, the residual head that starts
as the identity, the released models' soft prompt."""

from __future__ import annotations

import pytest
import torch

from cde_st.modules.heads import ContextWeightedPool, Head, SoftPrompt, WeightedPool, mean_pool


def test_mean_pool_averages_only_unmasked_positions():
    hidden = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled[0], hidden[0, :2].mean(0))
    assert torch.equal(pooled[1], torch.zeros(4))  # a row with no token pools to zero, not NaN


def test_residual_head_starts_as_the_identity_and_then_learns():
    torch.manual_seed(0)
    head = Head(8, 8, "gelu", residual=True)
    x = torch.randn(5, 8)
    assert torch.equal(head(x), x)
    with torch.no_grad():
        head.fc2.weight.normal_()
    assert not torch.allclose(head(x), x)


def test_plain_head_maps_widths_and_residual_needs_equal_widths():
    assert Head(8, 4, "relu", residual=False)(torch.randn(3, 8)).shape == (3, 4)
    with pytest.raises(ValueError, match="equal input and output widths, got 8 -> 4"):
        Head(8, 4, "gelu", residual=True)


def test_soft_prompt_has_n_vectors_of_width_d():
    torch.manual_seed(0)
    prompt = SoftPrompt(6, 3)
    out = prompt()
    assert out.shape == (3, 6)
    out.sum().backward()  # learned: every projection weight gets a gradient
    assert all(p.grad is not None for p in prompt.parameters())


def test_weighted_pool_starts_as_the_mean_and_then_weighs_tokens():
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    pool = WeightedPool(8)
    torch.testing.assert_close(pool(hidden, mask), mean_pool(hidden, mask))  # zero-initialised: the mean
    with torch.no_grad():
        pool.score.weight[0, 0] = 50.0  # the token with the largest first feature takes (almost) all the weight
    top = hidden[0, :3, 0].argmax()
    torch.testing.assert_close(pool(hidden, mask)[0], hidden[0, top], rtol=0, atol=1e-3)
    hidden[0, 3:] = 1e4  # padding never counts, whatever it holds
    torch.testing.assert_close(pool(hidden, mask)[0], hidden[0, top], rtol=0, atol=1e-3)
    assert torch.equal(pool(hidden, torch.zeros_like(mask)), torch.zeros(2, 8))  # no position: a zero vector


def test_context_pool_weighs_down_what_the_corpus_holds_often():
    words = torch.eye(4)  # four orthogonal word vectors; the corpus holds word 0 in every document, word 3 in none
    context = torch.stack([words[0] + words[1], words[0] + words[2], words[0] + words[1]]) / 2
    text = torch.stack([words[0], words[3]]).unsqueeze(0)  # one text: a common word and one the corpus lacks
    mask = torch.ones(1, 2)
    pool = ContextWeightedPool()
    torch.testing.assert_close(pool(text, mask, context), mean_pool(text, mask))  # zero-initialised: the mean
    with torch.no_grad():
        pool.strength.fill_(3.0)
    pooled = pool(text, mask, context)[0]
    assert pooled[3] > 0.9 and pooled[0] < 0.1  # the word the corpus lacks takes the weight
    torch.testing.assert_close(pool(text, mask, context[:0]), mean_pool(text, mask))  # no context: the mean
    torch.testing.assert_close(pool(text, mask, None), mean_pool(text, mask))
    # a context mask: each row weighs by the mean of the vectors it may read; one that reads none pools the mean
    rows = torch.cat([text, text])
    visible = torch.tensor([[True, True, True], [False, False, False]])
    pooled = pool(rows, torch.ones(2, 2), context, visible)
    torch.testing.assert_close(pooled[0], pool(text, mask, context)[0])
    torch.testing.assert_close(pooled[1], mean_pool(text, mask)[0])
