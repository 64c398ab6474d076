"""Sampling and bookkeeping of the corpus context (the J documents the first stage embeds).

One rule decides which documents become the context everywhere: the model's ``set_context``, the server's contexts,
the eval kit and the in-training evaluators call :func:`sample_context`, and ``cde-st-embed``, which streams the
corpus, keeps a :class:`BottomKSample`. Both take the corpus as a set of documents (:func:`context_documents`:
duplicates and blank documents dropped, a mapping's texts) and choose the ``size`` documents with the smallest
seeded 64-bit hash (:func:`text_hash`, a "bottom-k" sample: uniform over the distinct documents, since the hash is),
in that hash order, or in corpus order (first occurrences) for an architecture whose context rows carry positions
(:func:`reads_context_order`); a corpus of fewer distinct documents is tiled evenly (:func:`tile_sample`). So a
(corpus, J, seed) triple yields the same context rows in process and in the embed tool, for either kind of model;
the chosen documents do not depend on the corpus order, repeats, or how many workers read it.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "SEED_RULE",
    "BottomKSample",
    "ContextInfo",
    "bottom_k",
    "check_seed",
    "context_documents",
    "context_input",
    "distinct_documents",
    "fingerprint_array",
    "fingerprint_texts",
    "is_seed",
    "reads_context_order",
    "sample_context",
    "sample_indices",
    "sample_prompted_context",
    "text_hash",
    "tile_sample",
    "validate_texts",
    "vectors_context_info",
]


def validate_texts(texts: Sequence[str], what: str = "context corpus") -> list[str]:
    """Return ``texts`` as a list, raising a clear error for an empty corpus or non-string items."""
    if isinstance(texts, str):
        raise TypeError(f"The {what} must be a sequence of strings, got a single string.")
    texts = list(texts)
    if not texts:
        raise ValueError(f"The {what} is empty: give at least one document.")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"The {what} must contain only strings; item {i} is {type(text).__name__}: {text!r:.80}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"The {what} item {i} holds a lone surrogate character {text[exc.start]!r} at position "
                    f"{exc.start}, which is not valid Unicode text (it cannot be tokenised or hashed): {text!r:.80}. "
                    "Clean it first, e.g. text.encode('utf-8', 'replace').decode('utf-8')."
                ) from None
    return texts


# The one seed rule of the package (context samples, the clustered sampler, the eval kit, the training config): an
# integer in [0, 2**32), the range numpy, torch and faiss all accept (their seeds are unsigned 32-bit). The one wider
# use: the training loss derives a 64-bit seed per batch from its content (numpy's generators take it), so
# :func:`sample_indices` takes ``bits=64`` seeds.
SEED_RULE = "must be an integer in [0, 2**32)"


def is_seed(value: Any, bits: int = 32) -> bool:
    """Whether ``value`` is a valid seed: an integer (not a bool) in [0, 2**bits)."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and 0 <= value < 2**bits


def check_seed(seed: Any, name: str = "seed", bits: int = 32) -> int:
    """``seed`` as an int if it is a valid seed (:func:`is_seed`), else a ValueError naming ``name``.

    Example:
        >>> check_seed(7)
        7
    """
    if not is_seed(seed, bits):
        rule = SEED_RULE if bits == 32 else f"must be an integer in [0, 2**{bits})"
        raise ValueError(f"{name} {rule}, got {seed!r}.")
    return int(seed)


def sample_indices(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Pick ``size`` indices from ``range(n)``: seeded, without replacement; tiled only when ``n < size``.

    Tiling repeats every document as evenly as possible (each appears ``size // n`` or ``size // n + 1`` times),
    so a small corpus is represented uniformly rather than by a random subset with duplicates. ``seed``: an integer
    in [0, 2**64) (the training loss derives 64-bit seeds from batch content).
    """
    if n <= 0:
        raise ValueError("Cannot sample a context from an empty corpus.")
    if size < 0:
        raise ValueError(f"Context size must be >= 0, got {size}.")
    rng = np.random.default_rng(check_seed(seed, bits=64))
    if size <= n:
        return np.sort(rng.choice(n, size=size, replace=False))
    reps, rest = divmod(size, n)
    tiled = np.tile(np.arange(n), reps)
    extra = np.sort(rng.choice(n, size=rest, replace=False))
    return np.concatenate([tiled, extra])


def distinct_documents(texts: Iterable[str]) -> list[str]:
    """The documents of ``texts`` as a set, in corpus order: each document once (its first occurrence), blank
    ones (empty or whitespace only) dropped. The core of :func:`context_documents`, for callers whose texts are
    already checked strings (the eval kit's pools)."""
    return [t for t in dict.fromkeys(texts) if t.strip()]


def context_documents(corpus: Sequence[str] | Mapping[Any, str]) -> list[str]:
    """The documents a context is sampled from, by the one rule every route follows (``set_context``, the
    in-training evaluators, the eval kit, :func:`sample_context`):

    - a mapping (``{id: text}``, a BEIR corpus) gives its texts, never its ids;
    - the texts are checked (:func:`validate_texts`);
    - the corpus is a set of documents: a repeated document counts once (its first occurrence is kept, so the
      corpus order survives for the architectures that read it), and blank documents (empty or whitespace only:
      nothing to embed) are dropped.

    Example:
        >>> context_documents(["b", "a", "b", " ", "c"])
        ['b', 'a', 'c']
    """
    if isinstance(corpus, Mapping):
        corpus = list(corpus.values())
    documents = distinct_documents(validate_texts(corpus))
    if not documents:
        raise ValueError(
            "The context corpus holds only blank documents (empty or whitespace): give at least one with text."
        )
    return documents


def text_hash(text: str, seed: int) -> int:
    """The seeded 64-bit hash a document is ranked by: blake2b keyed with the seed's 8 bytes (a seed in [0, 2**64))."""
    key = seed.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest(), "little")


def reads_context_order(module: Any) -> bool:
    """Whether a contextual module's output depends on the order of its context rows, so that its context keeps the
    corpus order: cde-small-v2's context rows get rotary positions (``prefix_positions="sequence"``); position-free
    rows (cde_st's own, cde-small-v1's unrotated ones) read a set, and take the sample in hash order."""
    return getattr(module, "prefix_positions", "none") == "sequence"


def bottom_k(documents: Iterable[str], size: int, seed: int) -> list[str]:
    """The ``size`` distinct ``documents`` with the smallest :func:`text_hash`, smallest first (a tie of two 64-bit
    hashes, never seen in practice, goes by text); all of them when there are fewer. ``documents``: checked texts
    (blank ones are the caller's to drop: :func:`context_documents`).

    Example:
        >>> bottom_k(["a", "b", "c", "d"], 2, seed=0) == sorted("abcd", key=lambda t: text_hash(t, 0))[:2]
        True
    """
    return [text for _, text in heapq.nsmallest(size, ((text_hash(t, seed), t) for t in set(documents)))]


def tile_sample(sample: Sequence[str], size: int, seed: int = 0) -> list[str]:
    """The ``size`` context rows of a sample of distinct documents: the sample itself when it holds ``size``; a
    sample of fewer (the corpus had fewer distinct documents than ``size``) tiled evenly, each document ``size // n``
    or ``size // n + 1`` times (:func:`sample_indices`: whole copies of the sample in its order, then the seeded
    extra ones), so a small corpus fills every slot uniformly.

    Example:
        >>> tile_sample(["x", "y"], 5, seed=0)
        ['x', 'y', 'x', 'y', 'y']
    """
    sample = list(sample)
    if len(sample) >= size:
        return sample[:size]
    return [sample[i] for i in sample_indices(len(sample), size, seed)]


def sample_context(
    texts: Sequence[str] | Mapping[Any, str], size: int, seed: int = 0, keep_order: bool = False
) -> list[str]:
    """Sample the ``size`` context documents of a corpus: of its :func:`context_documents` (the corpus as a set:
    duplicates and blank documents dropped, a mapping's texts), the ``size`` with the smallest seeded hash
    (:func:`bottom_k`), in that hash order; a corpus of fewer than ``size`` distinct documents gives each of them,
    tiled evenly (:func:`tile_sample`). ``seed``: an integer in [0, 2**64).

    The choice and its order are a function of the corpus as a set and the seed: the same documents in another
    order or repeated (a shuffled or re-read corpus, another shard order, a document listed twice) give the same
    context, and ``cde-st-embed`` (:class:`BottomKSample`, streaming) gives the same rows. ``keep_order=True``
    returns the same documents in corpus order (first occurrences, then tiled as a hash-ordered sample is): for an
    architecture that reads the order of its context rows (:func:`reads_context_order`: cde-small-v2 gives them
    rotary positions), as the released model card's procedure keeps it; ``cde-st-embed`` then keeps the same order.

    Example:
        >>> sample_context(["d", "c", "b", "a"], size=3, seed=1)
        ['a', 'b', 'c']
        >>> sample_context(["d", "c", "b", "a"], size=3, seed=1, keep_order=True)
        ['c', 'b', 'a']
        >>> sample_context(["d", "c", "b", "a"], size=6, seed=0)  # 4 documents for 6 rows: tiled evenly
        ['d', 'a', 'b', 'c', 'b', 'c']
    """
    documents = context_documents(texts)
    if size < 0:
        raise ValueError(f"Context size must be >= 0, got {size}.")
    seed = check_seed(seed, bits=64)
    chosen = bottom_k(documents, size, seed)
    if keep_order:
        kept = set(chosen)
        chosen = [t for t in documents if t in kept]
    return tile_sample(chosen, size, seed)


class BottomKSample:
    """:func:`bottom_k` in one streaming pass: the ``size`` distinct non-blank texts with the smallest seeded hash
    among those offered, in memory ``size`` texts. Which texts it holds depends only on the texts offered as a set
    and the seed: not on their order, nor on repeats (a text seen twice has one hash); samples of parts of a corpus
    merge exactly (:meth:`merge`), so workers can each sample their part. ``seed``: the one seed rule
    (:func:`check_seed`).

    Each kept text also keeps its first position in the corpus (the smallest position it was offered at), so the
    sample can be given in corpus order (``keep_order``: the order ``sample_context(..., keep_order=True)`` gives,
    for an architecture whose context rows carry positions) as well as in hash order. A single stream needs no
    positions (each offer counts as the next); workers sampling parts of a corpus pass each text's position in the
    whole corpus, so that their merged sample orders the texts as one pass over the corpus would.

    Example:
        >>> a, b = BottomKSample(2, seed=0), BottomKSample(2, seed=0)
        >>> _ = a.offer_many(["x", "y"]), b.offer_many(["z", "x"])
        >>> a.merge(b).texts() == BottomKSample(2, seed=0).offer_many(["z", "y", "x"]).texts()
        True
        >>> BottomKSample(2, seed=0).offer_many(["d", "c", "b", "a"]).texts() == sample_context(["d", "c", "b", "a"], 2)
        True
        >>> ordered = BottomKSample(3, seed=1, keep_order=True).offer_many(["d", "c", "b", "a"]).texts()
        >>> ordered == sample_context(["d", "c", "b", "a"], 3, seed=1, keep_order=True)
        True
    """

    def __init__(self, size: int, seed: int = 0, keep_order: bool = False) -> None:
        if size < 1:
            raise ValueError(f"context size must be >= 1, got {size}.")
        self.size, self.seed, self.keep_order = size, check_seed(seed), keep_order
        self._heap: list[tuple[int, str]] = []  # (-hash, text): the largest kept hash on top
        self._kept: dict[str, int] = {}  # kept text -> its first position
        self._next = 0  # the position of an offer that names none: one past the largest seen

    def offer(self, text: str, position: int | None = None) -> None:
        """Consider one text (blank texts are never sampled) at ``position`` in the corpus (default: right after
        the largest position offered so far)."""
        if position is None:
            position = self._next
        self._next = max(self._next, position + 1)
        self._consider(text, position)

    def _consider(self, text: str, position: int) -> None:
        # A text not kept when first offered never is (the largest kept hash only falls), so a kept text has seen
        # every offer of itself since its first: the smallest of their positions is its first in the corpus.
        if text in self._kept:
            self._kept[text] = min(self._kept[text], position)
            return
        if not text.strip():
            return
        h = text_hash(text, self.seed)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, (-h, text))
            self._kept[text] = position
        elif h < -self._heap[0][0]:
            _, dropped = heapq.heapreplace(self._heap, (-h, text))
            del self._kept[dropped]
            self._kept[text] = position

    def offer_many(self, texts: Iterable[str], positions: Iterable[int] | None = None) -> BottomKSample:
        """:meth:`offer` each text (at the matching one of ``positions``, when given); returns this sample."""
        if positions is None:
            for text in texts:
                self.offer(text)
        else:
            for text, position in zip(texts, positions, strict=True):
                self.offer(text, position)
        return self

    def merge(self, other: BottomKSample) -> BottomKSample:
        """This sample after also offering everything ``other`` was offered, at the positions it was offered at
        (same size and seed)."""
        if (other.size, other.seed) != (self.size, self.seed):
            raise ValueError("only samples of the same size and seed merge.")
        for text, position in other._kept.items():
            self._consider(text, position)
        self._next = max(self._next, other._next)
        return self

    def texts(self) -> list[str]:
        """The sampled texts, smallest hash first, or with ``keep_order`` in corpus order (by first position);
        fewer than ``size`` when fewer distinct texts were offered (:func:`tile_sample` makes them the context rows
        :func:`sample_context` gives)."""
        by_hash = [text for _, text in sorted(self._heap, key=lambda item: (-item[0], item[1]))]
        return sorted(by_hash, key=self._kept.__getitem__) if self.keep_order else by_hash

    def __len__(self) -> int:
        return len(self._heap)


def fingerprint_texts(texts: Sequence[str], prompt: str = "") -> str:
    """A short, stable hash of the (prompted) context documents, for inspection and result bookkeeping."""
    h = hashlib.sha256(prompt.encode("utf-8"))
    for t in texts:
        h.update(b"\x00")
        h.update(t.encode("utf-8"))
    return h.hexdigest()[:16]


def fingerprint_array(array: np.ndarray) -> str:
    """A short, stable hash of precomputed context vectors."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    return hashlib.sha256(array.tobytes() + str(array.shape).encode()).hexdigest()[:16]


@dataclass
class ContextInfo:
    """What the active context is: ``size`` vectors from ``source`` ("texts" or "vectors")."""

    size: int
    seed: int | None
    fingerprint: str
    source: str
    prompt: str | None = None
    corpus_size: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def sample_prompted_context(
    corpus: Sequence[str] | Mapping[Any, str], size: int, seed: int, prompt: str, keep_order: bool = False
) -> tuple[list[str], ContextInfo]:
    """The ``size`` documents a context is embedded from (:func:`sample_context`, each with ``prompt`` in front),
    and the :class:`ContextInfo` that describes them."""
    corpus = context_documents(corpus)  # the corpus as a set of documents, the rule of every route
    sampled = [prompt + t for t in sample_context(corpus, size, seed, keep_order=keep_order)]
    info = ContextInfo(
        size=len(sampled),
        seed=seed,
        fingerprint=fingerprint_texts(sampled),
        source="texts",
        prompt=prompt,
        corpus_size=len(corpus),
    )
    return sampled, info


def vectors_context_info(vectors: np.ndarray) -> ContextInfo:
    """The :class:`ContextInfo` of a context given as precomputed (n, d) vectors."""
    return ContextInfo(size=len(vectors), seed=None, fingerprint=fingerprint_array(vectors), source="vectors")


def context_input(context: Any, hidden_size: int) -> Any:
    """``set_context``'s argument as texts (a sequence or mapping of strings) or vectors (a tensor or numeric array):
    a numpy array of strings (or objects, checked as texts later) becomes a list; None is a TypeError that says what
    to give (``hidden_size``: the width vectors must have)."""
    if context is None:
        raise TypeError(
            "set_context: context is None. Give corpus texts (a list of strings) or first-stage vectors of "
            f"shape (n, {hidden_size}); to remove the active context, call clear_context()."
        )
    if isinstance(context, np.ndarray) and context.dtype.kind in "USO":
        return context.tolist()
    return context
