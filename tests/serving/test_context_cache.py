"""The contexts' keys/values under a byte budget: least recently used out first, the entry in use never dropped
(even alone over the budget), replaced or discarded entries counted once, and a negative budget refused."""

from __future__ import annotations

import pytest

from cde_st.serving.context_cache import CacheStats, ContextStateCache


def test_the_least_recently_used_entry_goes_first():
    cache = ContextStateCache(100)
    cache.put("a", "entry a", 40)
    cache.put("b", "entry b", 40)
    assert cache.get("a") == "entry a"  # now the most recently used: b is the oldest
    cache.put("c", "entry c", 40)
    assert "b" not in cache and cache.get("b") is None
    assert ("a" in cache, "c" in cache) == (True, True)
    assert cache.stats() == CacheStats(contexts=2, bytes=80, evictions=1, budget=100)


def test_the_entry_in_use_is_kept_alone_over_the_budget():
    cache = ContextStateCache(0)  # recompute at every switch
    cache.put("a", "entry a", 50)
    assert cache.get("a") == "entry a" and cache.stats() == CacheStats(1, 50, 0, 0)
    cache.put("b", "entry b", 70)
    assert "a" not in cache and cache.get("b") == "entry b" and cache.stats() == CacheStats(1, 70, 1, 0)


def test_a_replaced_or_discarded_entry_is_counted_once():
    cache = ContextStateCache(100)
    cache.put("a", "old", 60)
    cache.put("a", "new", 30)  # the same context's new keys/values: not two entries
    assert cache.get("a") == "new" and cache.stats() == CacheStats(1, 30, 0, 100)
    cache.put("b", "entry b", 50)
    cache.discard("a")
    cache.discard("never kept")
    assert cache.stats() == CacheStats(1, 50, 0, 100)


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="The context cache budget must be >= 0 bytes, got -1"):
        ContextStateCache(-1)
