"""What the clustered sampler reads from its arguments and its dataset (cde_st.batching.sampler_inputs), called
directly: each option's check names it, the domains come from one place, the text columns are found or checked."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from datasets import Dataset

from cde_st.batching.sampler_inputs import (
    check_int,
    check_surrogate,
    checked_cluster_size,
    checked_replicas,
    resolve_domains,
    surrogate_argument,
    text_columns,
)

PAIRS = Dataset.from_dict(
    {"label": [1, 0, 1], "anchor": ["q1", "q2", "q3"], "positive": ["d1", "d2", "d3"], "domain": ["a", "b", "a"]}
)


@pytest.mark.parametrize(
    ("value", "minimum", "message"),
    [
        (True, None, "mini_batch must be an integer, got True"),
        (2.0, 1, "mini_batch must be a positive integer, got 2.0"),
        (0, 1, "mini_batch must be a positive integer, got 0"),
        (-1, 0, "mini_batch must be >= 0, got -1"),
    ],
)
def test_check_int_names_the_option(value, minimum, message):
    with pytest.raises(ValueError, match=message):
        check_int("mini_batch", value, minimum)


def test_check_int_takes_numpy_integers():
    check_int("n", np.int64(3), minimum=1)
    check_int("n", 0, minimum=0)


def test_cluster_size_defaults_to_the_batch_clamped_to_the_rows():
    assert checked_cluster_size(None, 64, 10) == 10
    assert checked_cluster_size(None, 4, 10) == 4
    assert checked_cluster_size(np.int32(7), 4, 10) == 7
    for bad, message in ((0, "between 1 and the number of rows in the dataset \\(10\\), got 0"), (11, "got 11"),
                         (2.5, "cluster_size must be an integer, got 2.5")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            checked_cluster_size(bad, 4, 10)
    with pytest.raises(ValueError, match="empty dataset"):
        checked_cluster_size(None, 4, 0)


def test_replicas_default_to_one_process_and_the_rank_is_checked():
    assert checked_replicas(None, None) == (1, None)  # no process group here
    assert checked_replicas(3, 2) == (3, 2)
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        checked_replicas(0, None)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        checked_replicas(2, 2)


def test_the_surrogate_options():
    with pytest.raises(ValueError, match="not both"):
        check_surrogate("a-model", "transformer", np.zeros((2, 2)), 0, 8)
    with pytest.raises(ValueError, match="surrogate_kind must be one of"):
        check_surrogate(None, "bag-of-words", None, 0, 8)
    with pytest.raises(ValueError, match="static_dims must be a positive integer, got 0"):
        check_surrogate(None, "static", None, 0, 0)
    with pytest.raises(ValueError, match="static_fit_pairs must be >= 0, got -1"):
        check_surrogate(None, "static", None, -1, 8)


def test_surrogate_argument_old_name_warns_and_both_names_are_refused():
    assert surrogate_argument("s", None) == "s"
    with pytest.warns(DeprecationWarning, match="use surrogate="):
        assert surrogate_argument(None, "m") == "m"
    with pytest.raises(ValueError, match="once"):
        surrogate_argument("s", "m")


def test_domains_from_one_place():
    assert resolve_domains(PAIRS.remove_columns("domain"), None, None, "domain", 3) is None
    assert resolve_domains(PAIRS, ["x", "y", "x"], None, "domain", 3) == ["x", "y", "x"]
    assert resolve_domains(PAIRS.remove_columns("domain"), None, PAIRS, "domain", 3) == ["a", "b", "a"]
    with pytest.warns(UserWarning, match="collator would also feed that column"):
        assert resolve_domains(PAIRS, None, None, "domain", 3) == ["a", "b", "a"]
    with pytest.raises(ValueError, match="either as `domains=` or through `domain_dataset=`"):
        resolve_domains(PAIRS, ["x"] * 3, PAIRS, "domain", 3)
    with pytest.raises(ValueError, match="Got 2 domains for a dataset of 3 rows"):
        resolve_domains(PAIRS, ["x", "y"], None, "domain", 3)
    with pytest.raises(ValueError, match="domain_dataset has no column 'topic'"):
        resolve_domains(PAIRS, None, PAIRS, "topic", 3)
    with pytest.raises(ValueError, match="domain_dataset has 3 rows but the dataset to sample has 4"):
        resolve_domains(PAIRS, None, PAIRS, "domain", 4)


def test_text_columns_found_past_labels_and_the_domain_or_checked():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert text_columns(PAIRS, None, None, ["label"], "domain") == ("anchor", "positive")
    assert text_columns(PAIRS, "positive", None, ["label"], "domain") == ("positive", "anchor")
    assert text_columns(PAIRS, None, "anchor", ["label"], "domain") == ("positive", "anchor")
    with pytest.raises(ValueError, match="query_column='question' is not a column"):
        text_columns(PAIRS, "question", None, ["label"], "domain")
    with pytest.raises(ValueError, match="both 'anchor'"):
        text_columns(PAIRS, "anchor", "anchor", ["label"], "domain")
    one_text = PAIRS.select_columns(["label", "anchor", "domain"])
    with pytest.raises(ValueError, match="second text column for the documents"):
        text_columns(one_text, None, None, ["label"], "domain")
