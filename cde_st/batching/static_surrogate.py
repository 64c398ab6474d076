"""``StaticSurrogate``: a static-embedding model, the fast surrogate of the clustered sampler.

A text is the (projected) mean of its tokens' rows in a token table: no attention, so embedding is tokenisation
plus a table look-up, one to two orders of magnitude faster on a CPU than a transformer (numbers in
``benchmarks/speed/RESULTS_sampler.md``). The table comes from a transformer distilled with model2vec (Tulkens & van
Dongen, 2024, https://github.com/MinishLab/model2vec); :meth:`StaticSurrogate.fit_to` adapts it to that
transformer's embeddings of the data to be clustered. Distilling, caching and fitting one for a dataset is
:mod:`cde_st.batching.surrogate`'s job; this module is the model itself and needs no model2vec.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

# Texts are cut to this many characters per token of max_seq_length before tokenising: the tokenizer's cost
# grows with the text, and a 20 Newsgroups body is thousands of characters of which 64 tokens need a few hundred.
# English WordPiece tokens average about 4-5 characters with their space; 8 leaves room for long words.
_CHARS_PER_TOKEN = 8
# Texts per tokenisation task (each task also pools its own rows).
_STATIC_CHUNK = 4096
# Ridge of the least-squares map from the static space to the teacher's (StaticSurrogate.fit_to).
_RIDGE = 1e-2


class StaticSurrogate:
    """A static-embedding surrogate: a text is the (projected) mean of its tokens' embeddings.

    ``encode`` computes ``normalize(normalize(mean of the token rows) @ projection)`` (no projection: the
    normalised mean, which is model2vec's ``StaticModel.encode`` up to its float16 rounding), tokenising in
    parallel threads (the Rust tokenizer releases the GIL) and pooling with ``torch.nn.functional.embedding_bag``.
    Unknown tokens are dropped, as model2vec does. :meth:`fit_to` adapts the token table and a projection to a
    teacher's embeddings and reduces the dimensions. Build one with :func:`~cde_st.batching.load_static_surrogate`.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (copied; its truncation and padding are switched off).
        embeddings: (V, D) token table, one row per token id.
        projection: (D, R) applied to the normalised mean, or ``None``.
        unk_token_id: the unknown token's id (dropped from texts), or ``None``.
        max_seq_length: tokens kept per text when ``encode`` is not given a length (``None``: whole texts).
        source: what it was distilled from (for the clustering cache key and messages).

    Example:
        >>> from cde_st.batching import load_static_surrogate
        >>> surrogate = load_static_surrogate()  # distils all-MiniLM-L6-v2 the first time (minutes), then cached
        >>> surrogate.encode(["a query", "a document about it"], max_seq_length=64).shape
        (2, 256)
    """

    def __init__(
        self,
        tokenizer: Any,
        embeddings: torch.Tensor | np.ndarray,
        projection: torch.Tensor | np.ndarray | None = None,
        *,
        unk_token_id: int | None = None,
        max_seq_length: int | None = None,
        source: str | None = None,
    ) -> None:
        # A copy without truncation or padding: this class truncates itself, and leaves the caller's object alone.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.embeddings = torch.as_tensor(np.asarray(embeddings, dtype=np.float32))  # (V, D)
        if self.embeddings.ndim != 2:
            raise ValueError(f"embeddings must be (vocabulary, dim), got shape {tuple(self.embeddings.shape)}.")
        self.projection = None if projection is None else torch.as_tensor(np.asarray(projection, dtype=np.float32))
        if self.projection is not None and (
            self.projection.ndim != 2 or len(self.projection) != self.embeddings.shape[1]
        ):
            raise ValueError(
                f"projection must be ({self.embeddings.shape[1]}, dim), got shape {tuple(self.projection.shape)}."
            )
        self.unk_token_id = unk_token_id
        self.max_seq_length = max_seq_length
        self.source = source
        self.timings: dict[str, float] = {}

    @classmethod
    def from_model2vec(cls, model: Any, source: str | None = None) -> StaticSurrogate:
        """Wrap a ``model2vec.StaticModel`` (a vocabulary-quantised one is expanded to one row per token)."""
        table = np.asarray(model.embedding, dtype=np.float32)
        mapping, weights = getattr(model, "token_mapping", None), getattr(model, "weights", None)
        if mapping is not None:
            table = table[np.asarray(mapping)]
        if weights is not None:
            table = table * np.asarray(weights, dtype=np.float32)[:, None]
        return cls(model.tokenizer, table, unk_token_id=getattr(model, "unk_token_id", None), source=source)

    @property
    def dim(self) -> int:
        """Dimension of the embeddings ``encode`` returns."""
        return int((self.projection if self.projection is not None else self.embeddings).shape[1])

    def fingerprint(self) -> str:
        """Identifies the surrogate in the clustering cache key: its source, token table and projection."""
        hasher = hashlib.sha256(f"static:{self.source}:{self.tokenizer.get_vocab_size()}".encode())
        hasher.update(self.embeddings.numpy().tobytes())
        if self.projection is not None:
            hasher.update(self.projection.numpy().tobytes())
        return hasher.hexdigest()

    # ---- embedding ---------------------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str], max_seq_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` without special tokens, cut to ``max_seq_length`` tokens (``None``: the
        surrogate's ``max_seq_length``), unknown tokens dropped.

        Returns:
            ``(flat_ids, lengths)``: (sum of lengths,) int64 ids of all texts one after another, and (N,) int64.
        """
        max_seq_length = self.max_seq_length if max_seq_length is None else max_seq_length
        texts = ["" if text is None else text for text in texts]
        chunks = [texts[i : i + _STATIC_CHUNK] for i in range(0, len(texts), _STATIC_CHUNK)]
        parts = _map_threads(lambda chunk: self._tokenize_chunk(chunk, max_seq_length), chunks)
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _tokenize_chunk(self, texts: list[str], max_seq_length: int | None) -> tuple[np.ndarray, np.ndarray]:
        if max_seq_length is not None:
            cut = max_seq_length * _CHARS_PER_TOKEN
            texts = [text[:cut] for text in texts]
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ids = [e.ids if max_seq_length is None else e.ids[:max_seq_length] for e in encodings]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        if self.unk_token_id is not None:
            known = flat != self.unk_token_id
            if not known.all():
                owner = np.repeat(np.arange(len(ids)), lengths)
                lengths = np.bincount(owner[known], minlength=len(ids)).astype(np.int64)
                flat = flat[known]
        return flat, lengths

    def embed_tokens(self, flat_ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(N, dim) float32 L2-normalised embeddings of tokenised texts (zeros for a text without tokens)."""
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out = np.empty((len(lengths), self.dim), dtype=np.float32)

        def pool(start: int) -> None:
            stop = min(start + _STATIC_CHUNK, len(lengths))
            ids = torch.from_numpy(flat_ids[offsets[start] : offsets[stop]])
            bags = torch.from_numpy(offsets[start:stop] - offsets[start])
            mean = torch.nn.functional.embedding_bag(ids, self.embeddings, bags, mode="mean")
            features = torch.nn.functional.normalize(mean, dim=1)
            if self.projection is not None:
                features = torch.nn.functional.normalize(features @ self.projection, dim=1)
            out[start:stop] = features.numpy()

        _map_threads(pool, list(range(0, len(lengths), _STATIC_CHUNK)))
        return out

    def encode(self, texts: Sequence[str], *, max_seq_length: int | None = None) -> np.ndarray:
        """Embed ``texts``: (N, dim) float32, L2-normalised, cut to ``max_seq_length`` tokens (``None``: the
        surrogate's ``max_seq_length``).

        Records ``timings`` (``tokenize_s``, ``pool_s``).
        """
        start = time.perf_counter()
        flat, lengths = self.tokenize(texts, max_seq_length)
        tokenized = time.perf_counter()
        emb = self.embed_tokens(flat, lengths)
        self.timings = {"tokenize_s": tokenized - start, "pool_s": time.perf_counter() - tokenized}
        return emb

    # ---- fitting to a teacher ------------------------------------------------------------------------------------

    def fit_to(
        self,
        texts: Sequence[str],
        targets: np.ndarray | None,
        *,
        dims: int | None = None,
        max_seq_length: int | None = None,
        epochs: int = 10,
        lr: float = 1e-3,
        batch_size: int = 256,
        seed: int = 0,
    ) -> StaticSurrogate:
        """A copy adapted to a teacher's embeddings of ``texts`` and reduced to ``dims`` dimensions.

        The idea of model2vec's tokenlearn (fit the static table to the teacher's outputs on a corpus), on a small
        sample of the data to be clustered: a linear map from the normalised token mean to the teacher's space is
        solved by ridge regression, then the token table and the map are trained for ``epochs`` with Adam on the
        cosine distance to ``targets``. Finally the map is composed with a PCA of the sample's outputs, so that
        k-means runs on ``dims`` dimensions. With ``targets=None`` only the PCA is fitted.

        Args:
            texts: the sample's texts.
            targets: (len(texts), T) the teacher's embeddings of ``texts``, or ``None``.
            dims: output dimensions (PCA); ``None`` keeps the teacher's (or the table's) dimension.
            max_seq_length: tokens per text, as for :meth:`encode`; the copy keeps it as its ``max_seq_length``.
            epochs, lr, batch_size: the training of the table and the map.
            seed: seeds the batch order.
        """
        if dims is not None and (not isinstance(dims, (int, np.integer)) or isinstance(dims, bool) or dims < 1):
            raise ValueError(f"dims must be a positive integer or None, got {dims!r}.")
        flat, lengths = self.tokenize(texts, max_seq_length)
        vocab, width = self.embeddings.shape
        # (n, L) ids padded with `vocab`, an extra row that embedding_bag leaves out of the mean.
        padded = np.full((len(lengths), max(int(lengths.max(initial=0)), 1)), vocab, dtype=np.int64)
        owner = np.repeat(np.arange(len(lengths)), lengths)
        padded[owner, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
        padded = torch.from_numpy(padded)
        table = torch.cat([self.embeddings, torch.zeros(1, width)])

        def features(rows: torch.Tensor | slice, weight: torch.Tensor) -> torch.Tensor:
            # Sparse gradients: a batch touches a few thousand of the table's rows (SparseAdam updates only those).
            mean = torch.nn.functional.embedding_bag(padded[rows], weight, mode="mean", padding_idx=vocab, sparse=True)
            return torch.nn.functional.normalize(mean, dim=1)

        with torch.no_grad():
            sample = features(slice(None), table)  # (n, D)
        projection = None
        if targets is not None:
            table, projection, sample = self._fit_to_targets(
                features, table, sample, targets, epochs, lr, batch_size, seed
            )
        if dims is not None and dims < sample.shape[1]:
            with torch.no_grad():
                _, _, components = torch.linalg.svd(sample - sample.mean(0), full_matrices=False)
                pca = components[:dims].T  # (out, dims)
            projection = pca if projection is None else projection @ pca
        return StaticSurrogate(
            self.tokenizer,
            table[:vocab].detach().clone(),
            None if projection is None else projection.detach().clone(),
            unk_token_id=self.unk_token_id,
            max_seq_length=self.max_seq_length if max_seq_length is None else max_seq_length,
            source=self.source,
        )

    @classmethod
    def _fit_to_targets(
        cls,
        features: Any,
        table: torch.Tensor,
        sample: torch.Tensor,
        targets: np.ndarray,
        epochs: int,
        lr: float,
        batch_size: int,
        seed: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The teacher fit of :meth:`fit_to`: the map from the (n, D) ``sample`` features to the normalised
        ``targets`` by ridge regression, then the table and the map trained together; the trained table, the map
        (D, T) and the sample's outputs (n, T) through them."""
        targets = torch.nn.functional.normalize(torch.as_tensor(np.asarray(targets, dtype=np.float32)), dim=1)
        if len(targets) != len(sample):
            raise ValueError(f"Got {len(targets)} target embeddings for {len(sample)} texts.")
        # Ridge regression (a small ridge keeps the solve stable for tokens the sample barely covers).
        gram = sample.T @ sample + _RIDGE * torch.eye(sample.shape[1])
        projection = torch.linalg.solve(gram, sample.T @ targets)  # (D, T)
        if epochs > 0:
            # Small ops, run on one thread: on a busy 2-core machine, where OpenMP threads spin waiting for each
            # other, the fit of 4,096 pairs took 151 s on 2 threads and 8-11 s on one.
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                table, projection = cls._train(features, table, projection, targets, epochs, lr, batch_size, seed)
            finally:
                torch.set_num_threads(threads)
        with torch.no_grad():
            sample = torch.nn.functional.normalize(features(slice(None), table) @ projection, dim=1)
        return table, projection, sample

    @staticmethod
    def _train(
        features: Any,
        table: torch.Tensor,
        projection: torch.Tensor,
        targets: torch.Tensor,
        epochs: int,
        lr: float,
        batch_size: int,
        seed: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        table = torch.nn.Parameter(table.clone())
        projection = torch.nn.Parameter(projection.clone())
        optimizers = [torch.optim.SparseAdam([table], lr=lr), torch.optim.Adam([projection], lr=lr)]
        generator = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(len(targets), generator=generator)
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                out = torch.nn.functional.normalize(features(rows, table) @ projection, dim=1)
                loss = (1.0 - (out * targets[rows]).sum(dim=1)).mean()
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for optimizer in optimizers:
                    optimizer.step()
        return table.detach(), projection.detach()


def _map_threads(fn: Any, items: list[Any]) -> list[Any]:
    """``[fn(item) for item in items]`` on up to ``torch.get_num_threads()`` threads."""
    workers = max(1, min(torch.get_num_threads(), os.cpu_count() or 1, len(items)))
    if workers == 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


__all__ = ["StaticSurrogate"]
