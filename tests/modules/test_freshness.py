"""WeightsCheck (when a forward compares the weights) and the fingerprints of freshness.py, without a model."""

from __future__ import annotations

import torch

from cde_st.modules.freshness import WeightsCheck, embedding_fingerprint, values_fingerprint


def _params() -> list[torch.Tensor]:
    return [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.zeros(4))]


def test_outside_an_encode_call_every_forward_compares():
    check, params = WeightsCheck(), _params()
    assert check.is_due()
    check.done(params)
    assert check.is_due()  # nothing between two direct forward calls is known to leave the weights alone


def test_inside_one_call_only_the_first_forward_compares_until_a_parameter_moves():
    check, params = WeightsCheck(), _params()
    with check.one_per_call():
        assert check.is_due()
        check.done(params)
        assert not check.is_due()
        with torch.no_grad():
            params[0].add_(1.0)  # bumps the version counter
        assert check.is_due()
        check.done(params)
        assert not check.is_due()
        check.mark_due()  # the module went to eval mode again
        assert check.is_due()


def test_a_new_call_compares_again():
    check, params = WeightsCheck(), _params()
    with check.one_per_call():
        check.done(params)
    with check.one_per_call():
        assert check.is_due()


def test_embedding_fingerprint_keys_context_weights_and_config():
    params = _params()
    vectors = torch.ones(2, 3)
    key = embedding_fingerprint(vectors, params, {"context_size": 2})
    assert key == embedding_fingerprint(vectors.clone(), [p.clone() for p in params], {"context_size": 2})
    assert key != embedding_fingerprint(None, params, {"context_size": 2})
    assert key != embedding_fingerprint(vectors * 2, params, {"context_size": 2})
    assert key != embedding_fingerprint(vectors, params, {"context_size": 3})
    with torch.no_grad():
        params[1].add_(0.5)
    assert key != embedding_fingerprint(vectors, params, {"context_size": 2})


def test_values_fingerprint_sees_a_value_moved_between_rows():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[2.0, 2.0], [2.0, 4.0]])  # same total, other rows
    assert not torch.equal(values_fingerprint([a]), values_fingerprint([b]))
    assert torch.equal(values_fingerprint([a]), values_fingerprint([a.clone()]))
