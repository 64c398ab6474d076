"""cde_st.coercion: the one coercion rule of every config; here its choice (``Literal``) fields."""

from __future__ import annotations

from typing import Literal

import pytest

from cde_st.coercion import ConfigValueError, coerce, type_name

Order = Literal["greedy", "random"]


def test_a_choice_field_takes_one_of_its_values():
    assert coerce("random", Order, "order") == "random"


@pytest.mark.parametrize("bad", ["Random", "fast", 1, None])
def test_a_choice_field_refuses_anything_else_naming_the_field_and_the_allowed_values(bad):
    with pytest.raises(ConfigValueError, match=r"field 'order' = .*: expected one of \['greedy', 'random'\]"):
        coerce(bad, Order, "order")


def test_a_choice_in_a_union_keeps_the_other_members():
    hint = bool | Literal["auto"]
    assert coerce(True, hint, "bf16") is True and coerce("auto", hint, "bf16") == "auto"
    with pytest.raises(ConfigValueError, match=r"field 'bf16' = 'yes' \(str\): expected bool or 'auto'"):
        coerce("yes", hint, "bf16")
    assert type_name(Order) == "one of 'greedy', 'random'"


def test_a_choice_of_the_training_config_is_refused_with_the_field_and_its_choices():
    from cde_st.training import TrainConfig, TrainConfigError

    with pytest.raises(TrainConfigError, match=r"field 'batching' = 'shuffled' \(str\): expected one of"):
        TrainConfig(batching="shuffled")
