"""The warning when sentence-transformers' mine_hard_negatives reads a contextual model's name as an embedding-cache
key (cde_st.cache_key_warning): given to that reader only, and silenced while cde_st's own miner calls it."""

from __future__ import annotations

import warnings

import pytest
from sentence_transformers.util import hard_negatives as st_hard_negatives

from cde_st.cache_key_warning import ContextCacheKeyWarning, keyed_by_model_state, warn_if_read_as_cache_key


def card_read() -> None:
    """Stands in for the model card's ``base_model`` read, the frame between the reader and the check."""
    warn_if_read_as_cache_key()


def reader_in(module_name: str):
    """A function defined in a module named ``module_name`` that reads the card."""
    namespace = {"__name__": module_name, "card_read": card_read}
    exec("def read():\n    card_read()\n", namespace)
    return namespace["read"]


def test_sentence_transformers_miner_reading_the_name_is_warned():
    with pytest.warns(ContextCacheKeyWarning, match="Call cde_st.mine_hard_negatives"):
        reader_in(st_hard_negatives.__name__)()


def test_no_warning_for_other_readers_or_inside_the_keyed_call():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader_in("some_user_module")()
        with keyed_by_model_state():
            reader_in(st_hard_negatives.__name__)()


def test_the_keyed_scope_ends_with_its_block_even_on_an_error():
    with pytest.raises(RuntimeError), keyed_by_model_state():
        raise RuntimeError("the mining failed")
    with pytest.warns(ContextCacheKeyWarning):
        reader_in(st_hard_negatives.__name__)()
