"""Sampling a corpus context in one streaming pass, the same sample whatever the order the corpus is read in.

Every distinct non-blank text gets a seeded 64-bit hash; the sample is the ``size`` texts with the smallest hashes
(a "bottom-k" sample: uniform over the distinct texts, since the hash is). It depends only on the corpus as a set of
texts and the seed: not on the order the records arrive in, nor on how many workers read them, nor on repeats (a
text seen twice has one hash). Memory is ``size`` texts. Samples of parts of the corpus merge exactly
(:meth:`BottomKSample.merge`), so workers can each sample their part.

This is not :func:`cde_st.context.sample_context`'s choice (that one needs the whole corpus in memory to sort it):
a corpus embedded with ``cde-st-embed`` has its own context, recorded by fingerprint in the job's manifest.
"""

from __future__ import annotations

import hashlib
import heapq

from cde_st.context import check_seed

__all__ = ["BottomKSample", "text_hash"]


def text_hash(text: str, seed: int) -> int:
    """The seeded 64-bit hash of a text the sample is ranked by."""
    key = seed.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest(), "little")


class BottomKSample:
    """The ``size`` distinct texts with the smallest seeded hash among those offered.

    Example:
        >>> a, b = BottomKSample(2, seed=0), BottomKSample(2, seed=0)
        >>> _ = a.offer_many(["x", "y"]), b.offer_many(["z", "x"])
        >>> a.merge(b).texts() == BottomKSample(2, seed=0).offer_many(["z", "y", "x"]).texts()
        True
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 1:
            raise ValueError(f"context size must be >= 1, got {size}.")
        self.size, self.seed = size, check_seed(seed)
        self._heap: list[tuple[int, str]] = []  # (-hash, text): the largest kept hash on top
        self._kept: set[str] = set()

    def offer(self, text: str) -> None:
        """Consider one text (blank texts are never sampled)."""
        if not text.strip() or text in self._kept:
            return
        h = text_hash(text, self.seed)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, (-h, text))
            self._kept.add(text)
        elif h < -self._heap[0][0]:
            _, dropped = heapq.heapreplace(self._heap, (-h, text))
            self._kept.discard(dropped)
            self._kept.add(text)

    def offer_many(self, texts) -> BottomKSample:
        """:meth:`offer` each text; returns this sample."""
        for text in texts:
            self.offer(text)
        return self

    def merge(self, other: BottomKSample) -> BottomKSample:
        """This sample after also offering everything ``other`` was offered (same size and seed)."""
        if (other.size, other.seed) != (self.size, self.seed):
            raise ValueError("only samples of the same size and seed merge.")
        self.offer_many(other.texts())
        return self

    def texts(self) -> list[str]:
        """The sampled texts, smallest hash first (fewer than ``size`` when the corpus has fewer distinct texts)."""
        return [text for _, text in sorted(self._heap, key=lambda item: (-item[0], item[1]))]

    def __len__(self) -> int:
        return len(self._heap)
