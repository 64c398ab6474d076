"""cde_st.coercion: the one rule every config entry point converts values with (bools, whole numbers, choices), and
config-file reading that refuses ambiguous text (duplicate keys, YAML 1.1 words read as booleans)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

from cde_st.coercion import ConfigValueError, coerce, load_config_text, type_name

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


@pytest.mark.parametrize("value", ["false", "true", "no", "yes", 0, 1, None, 1.0])
def test_a_bool_field_takes_only_a_real_bool(value):
    with pytest.raises(ConfigValueError, match=r"'include_prompt' = .*expected bool"):
        coerce(value, bool, "include_prompt")
    assert coerce(False, bool, "include_prompt") is False
    assert coerce(np.bool_(True), bool, "include_prompt") is True


@pytest.mark.parametrize("value", [8.7, "8.7", "eight", True, float("nan"), float("inf"), [8]])
def test_an_int_field_refuses_anything_that_is_not_a_whole_number(value):
    with pytest.raises(ConfigValueError, match=r"'context_size' = .*expected int"):
        coerce(value, int, "context_size")


def test_whole_numbers_of_any_kind_are_ints_and_numbers_are_floats():
    assert coerce(8.0, int, "n") == 8 and type(coerce(8.0, int, "n")) is int
    assert type(coerce(np.int64(8), int, "n")) is int
    assert type(coerce(np.float32(0.5), float, "x")) is float
    assert coerce("1e-3", float, "lr") == 1e-3


def test_the_error_is_both_a_type_and_a_value_error_and_can_say_the_rule():
    with pytest.raises(ConfigValueError) as err:
        coerce("x", int, "n")
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)
    with pytest.raises(ConfigValueError, match=r"max_seq_length must be a positive integer"):
        coerce(2.5, int, "max_seq_length", rule="max_seq_length must be a positive integer")


@pytest.mark.parametrize(
    "name, text, expected",
    [
        (
            "c.yaml",
            "seed: 1\nbatch_size: 8\nseed: 2\n",
            r"c\.yaml, line 3: key 'seed' appears twice \(first on line 1\)",
        ),
        (
            "c.yaml",
            "model_config:\n  context_gate: true\n  context_gate: false\n",
            r"line 3: key 'model_config.context_gate'",
        ),
        ("c.json", '{\n "seed": 1,\n "seed": 2\n}\n', r"c\.json, line 3: key 'seed' appears twice"),
        (
            "c.json",
            '{"model_config": {"context_gate": true, "context_gate": false}}',
            r"'model_config.context_gate' appears twice",
        ),
    ],
)
def test_a_duplicate_key_is_refused_naming_the_key_file_and_line(name, text, expected):
    with pytest.raises(ConfigValueError, match=expected):
        load_config_text(text, name)


def test_only_true_and_false_are_booleans_in_a_yaml_config():
    values = load_config_text("a: yes\nb: off\nc: true\nd: False\ne: no\n", "c.yaml")
    assert values == {"a": "yes", "b": "off", "c": True, "d": False, "e": "no"}
    assert load_config_text("lr: 1e-3\nn: 4\n", "c.yaml") == {"lr": 1e-3, "n": 4}
