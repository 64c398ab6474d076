"""The keys/values of several contexts, kept under a memory budget, least recently used first out.

In cached attention (``context_attention="cached"``) the context rows' per-layer keys/values are computed once
per context (:class:`~cde_st.modules.context_attention.ContextKVCache`); a server that keeps only the active
context's would recompute them at every switch between contexts. This cache keeps one entry per context (the
object the module's cache holds), counts the bytes of their keys/values, and drops the least recently used when
the total passes the budget. The context in use is never dropped, even alone over the budget (a budget of 0 then
means: recompute at every switch). Memory of the vectors themselves (J x d floats per context) is not counted:
every stored context keeps those in memory anyway.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheStats", "ContextStateCache"]


@dataclass(frozen=True)
class CacheStats:
    """The live set (contexts and bytes of keys/values held) and how many entries were dropped for the budget."""

    contexts: int
    bytes: int
    evictions: int
    budget: int


class ContextStateCache:
    """Entries (any object) by key, with their size in bytes, under ``budget_bytes`` (LRU). Not thread-safe: the
    engine uses it from its one worker thread."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"The context cache budget must be >= 0 bytes, got {budget_bytes}.")
        self.budget = int(budget_bytes)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._evictions = 0

    def get(self, key: Hashable) -> Any | None:
        """The entry of ``key`` (now the most recently used), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: Hashable, entry: Any, nbytes: int) -> None:
        """Keep ``entry`` (``nbytes`` of keys/values) for ``key``, dropping least recently used others while the
        total is over the budget."""
        self.discard(key)
        self._entries[key] = (entry, int(nbytes))
        self._bytes += int(nbytes)
        while self._bytes > self.budget and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            self.discard(oldest)
            self._evictions += 1

    def discard(self, key: Hashable) -> None:
        """Forget ``key``'s entry (a deleted or replaced context)."""
        found = self._entries.pop(key, None)
        if found is not None:
            self._bytes -= found[1]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def stats(self) -> CacheStats:
        """The live set and the evictions so far."""
        return CacheStats(len(self._entries), self._bytes, self._evictions, self.budget)
