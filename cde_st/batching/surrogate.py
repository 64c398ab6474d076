"""Surrogate embeddings of the pairs, the input of the clustering.

Two kinds of surrogate:

- ``"transformer"`` (the default): a ``SentenceTransformer`` (all-MiniLM-L6-v2 unless told otherwise), run as is.
- ``"static"``: a static-embedding model distilled from that transformer with model2vec (Tulkens & van Dongen,
  2024, https://github.com/MinishLab/model2vec): every vocabulary token is embedded once by the transformer, the
  token table is reduced with PCA, and a text is the mean of its tokens' rows. No attention, so embedding is
  tokenisation plus a table look-up: one to two orders of magnitude faster on a CPU (numbers in
  ``benchmarks/RESULTS_sampler.md``). The distilled model is cached on disk, keyed by the source model's
  fingerprint, so it is distilled once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from cde_st._files import write_folder_atomically
from cde_st.batching.cache import _model_fingerprint, default_surrogate_cache_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

SurrogateKind = Literal["transformer", "static"]
SURROGATE_KINDS: tuple[str, ...] = ("transformer", "static")

# Texts are cut to this many characters per token of max_seq_length before tokenising: the tokenizer's cost
# grows with the text, and a 20 Newsgroups body is thousands of characters of which 64 tokens need a few hundred.
# English WordPiece tokens average about 4-5 characters with their space; 8 leaves room for long words.
_CHARS_PER_TOKEN = 8
# Texts per tokenisation task (each task also pools its own rows).
_STATIC_CHUNK = 4096
# PCA dimensions of the distilled token table (model2vec's default).
_DISTILL_DIMS = 256
# Pairs whose static embeddings fit the PCA when there is no teacher (fit_pairs=0).
_PCA_SAMPLE_PAIRS = 16_384
# Ridge of the least-squares map from the static space to the teacher's (StaticSurrogate.fit_to).
_RIDGE = 1e-2
_INSTALL_HINT = "pip install 'cde_st[fast-surrogate]'  (model2vec and skeletoken, its distillation dependency)"


def _import_model2vec(for_distillation: bool = False) -> Any:
    """The model2vec module, or an ImportError that says what to install."""
    try:
        import model2vec

        if for_distillation:
            import model2vec.distill  # noqa: F401  (needs skeletoken and transformers)
    except ImportError as exc:
        raise ImportError(
            f"The static (fast) surrogate needs the model2vec package, which could not be imported ({exc}). "
            f"Install it with: {_INSTALL_HINT}; or use surrogate_kind='transformer'."
        ) from exc
    return model2vec


class StaticSurrogate:
    """A static-embedding surrogate: a text is the (projected) mean of its tokens' embeddings.

    ``encode`` computes ``normalize(normalize(mean of the token rows) @ projection)`` (no projection: the
    normalised mean, which is model2vec's ``StaticModel.encode`` up to its float16 rounding), tokenising in
    parallel threads (the Rust tokenizer releases the GIL) and pooling with ``torch.nn.functional.embedding_bag``.
    Unknown tokens are dropped, as model2vec does. :meth:`fit_to` adapts the token table and a projection to a
    teacher's embeddings and reduces the dimensions. Build one with :func:`load_static_surrogate`.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (copied; its truncation and padding are switched off).
        embeddings: (V, D) token table, one row per token id.
        projection: (D, R) applied to the normalised mean, or ``None``.
        unk_token_id: the unknown token's id (dropped from texts), or ``None``.
        max_seq_length: tokens kept per text when ``encode`` is not given a length (``None``: whole texts).
        source: what it was distilled from (for the clustering cache key and messages).

    Example:
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
        from tokenizers import Tokenizer

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
            targets = torch.nn.functional.normalize(torch.as_tensor(np.asarray(targets, dtype=np.float32)), dim=1)
            if len(targets) != len(lengths):
                raise ValueError(f"Got {len(targets)} target embeddings for {len(lengths)} texts.")
            # Ridge regression (a small ridge keeps the solve stable for tokens the sample barely covers).
            gram = sample.T @ sample + _RIDGE * torch.eye(width)
            projection = torch.linalg.solve(gram, sample.T @ targets)  # (D, T)
            if epochs > 0:
                # Small ops, run on one thread: on a busy 2-core machine, where OpenMP threads spin waiting for each
                # other, the fit of 4,096 pairs took 151 s on 2 threads and 8-11 s on one.
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    table, projection = self._train(features, table, projection, targets, epochs, lr, batch_size, seed)
                finally:
                    torch.set_num_threads(threads)
            with torch.no_grad():
                sample = torch.nn.functional.normalize(features(slice(None), table) @ projection, dim=1)
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


def distill_static_surrogate(
    model: str | os.PathLike | None = None,
    *,
    dims: int = _DISTILL_DIMS,
    cache_dir: str | os.PathLike | None = None,
    device: str | None = None,
) -> Path:
    """Distil a static-embedding surrogate from a sentence-transformers model with model2vec, once.

    The result is kept under ``cache_dir`` (default ``$CDE_ST_CACHE/surrogates``, else
    ``~/.cache/cde_st/surrogates``) in a folder keyed by the source model's fingerprint (path, file sizes and
    modification times), ``dims`` and the model2vec version; later calls return that folder without distilling.
    Runs offline from a local folder. Needs ``pip install 'cde_st[fast-surrogate]'``.

    Args:
        model: a sentence-transformers / Hugging Face model folder or hub id; ``None`` is the offline
            all-MiniLM-L6-v2 (``cde_st._defaults``).
        dims: PCA dimensions of the token table (at most the model's hidden size).
        cache_dir: where distilled models are kept.
        device: where the distillation forward passes run (model2vec picks one when ``None``).

    Returns:
        The folder of the distilled model (model2vec format).
    """
    if model is None:
        from cde_st._defaults import default_surrogate_model_path

        model = default_surrogate_model_path()
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"distill_static_surrogate needs a model folder or hub id, got {type(model).__name__}; "
            "save the model and pass its folder."
        )
    if not isinstance(dims, int) or isinstance(dims, bool) or dims < 1:
        raise ValueError(f"dims must be a positive integer, got {dims!r}.")
    model2vec = _import_model2vec(for_distillation=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_surrogate_cache_dir()
    key = _model_fingerprint(os.fspath(model))[:24]
    folder = cache_dir / f"static-{key}-d{dims}-m2v{model2vec.__version__}"
    if (folder / "config.json").exists():
        return folder

    from model2vec.distill import distill

    logger.info("Distilling a %d-d static surrogate from %s (once; cached in %s)", dims, os.fspath(model), folder)
    start = time.perf_counter()
    static = distill(model_name=os.fspath(model), pca_dims=dims, device=device)
    write_folder_atomically(folder, static.save_pretrained)
    logger.info("Distilled the static surrogate in %.1fs", time.perf_counter() - start)
    return folder


def load_static_surrogate(
    model: str | os.PathLike | None = None,
    *,
    dims: int = _DISTILL_DIMS,
    cache_dir: str | os.PathLike | None = None,
    device: str | None = None,
) -> StaticSurrogate:
    """The :class:`StaticSurrogate` distilled from ``model`` (see :func:`distill_static_surrogate`; distilled on
    the first call, loaded from the cache afterwards)."""
    model2vec = _import_model2vec()
    folder = distill_static_surrogate(model, dims=dims, cache_dir=cache_dir, device=device)
    source = None if model is None else os.fspath(model)
    return StaticSurrogate.from_model2vec(model2vec.StaticModel.from_pretrained(os.fspath(folder)), source=source)


def fit_static_surrogate(
    model: str | os.PathLike | None,
    queries: Sequence[str],
    documents: Sequence[str],
    *,
    fit_pairs: int = 4096,
    dims: int | None = 128,
    max_seq_length: int | None = None,
    seed: int = 0,
    device: str | None = None,
    encode_batch_size: int = 64,
    cache_dir: str | os.PathLike | None = None,
    show_progress_bar: bool = False,
) -> StaticSurrogate:
    """The static surrogate for clustering these pairs: distilled from the transformer ``model`` (once, cached),
    fitted to ``model``'s embeddings of ``fit_pairs`` random pairs of the data (:meth:`StaticSurrogate.fit_to`),
    reduced to ``dims`` dimensions.

    The transformer embeds only the sample (its cost does not grow with the data); the static model embeds
    everything. ``fit_pairs=0`` skips the transformer (distilled table and PCA only: faster, easier batches).

    Args:
        model: the transformer surrogate's folder or hub id; ``None`` is the offline all-MiniLM-L6-v2.
        queries, documents: the pairs to be clustered (the sample is drawn from them).
        fit_pairs: pairs embedded by the transformer for the fit (both sides: ``2 * fit_pairs`` texts).
        dims: dimensions of the returned embeddings (PCA); ``None`` keeps the transformer's.
        max_seq_length: tokens per text, for the transformer and the static model alike (``None``: the
            transformer's own ``max_seq_length``, which the returned surrogate keeps).
        seed: draws the sample and the fit's batch order.
        device: device of the transformer (and of the distillation).
        encode_batch_size: the transformer's encoding batch size.
        cache_dir: where distilled models are kept (default ``$CDE_ST_CACHE/surrogates``).
        show_progress_bar: progress bars of the transformer's encoding.

    Returns:
        A :class:`StaticSurrogate` whose ``timings`` hold ``load_s`` (distil or load), ``teacher_s`` (the
        transformer on the sample) and ``fit_s``.
    """
    if len(queries) != len(documents):
        raise ValueError(f"Got {len(queries)} queries but {len(documents)} documents.")
    if not isinstance(fit_pairs, (int, np.integer)) or isinstance(fit_pairs, bool) or fit_pairs < 0:
        raise ValueError(f"fit_pairs must be a non-negative integer, got {fit_pairs!r}.")
    if model is None:
        from cde_st._defaults import default_surrogate_model_path

        model = default_surrogate_model_path()
    start = time.perf_counter()
    static = load_static_surrogate(model, cache_dir=cache_dir, device=device)
    loaded = time.perf_counter()

    rng = np.random.default_rng(seed)
    # Without a teacher the sample only fits the PCA; its size then costs next to nothing.
    sample_size = min(len(queries), fit_pairs if fit_pairs > 0 else _PCA_SAMPLE_PAIRS)
    rows = np.sort(rng.choice(len(queries), sample_size, replace=False))
    sample_queries = ["" if queries[i] is None else queries[i] for i in rows]
    sample_documents = ["" if documents[i] is None else documents[i] for i in rows]
    targets = None
    if fit_pairs > 0 or max_seq_length is None:
        from sentence_transformers import SentenceTransformer

        teacher = SentenceTransformer(os.fspath(model), device=device)
        teacher.eval()
        max_seq_length = max_seq_length or teacher.max_seq_length
    if fit_pairs > 0:
        q_emb, d_emb = embed_pairs(
            teacher,
            sample_queries,
            sample_documents,
            batch_size=encode_batch_size,
            max_seq_length=max_seq_length,
            show_progress_bar=show_progress_bar,
        )
        targets = np.concatenate([q_emb, d_emb])
    taught = time.perf_counter()
    fitted = static.fit_to(
        sample_queries + sample_documents, targets, dims=dims, max_seq_length=max_seq_length, seed=seed
    )
    fitted.timings = {
        "load_s": loaded - start,
        "teacher_s": taught - loaded,
        "fit_s": time.perf_counter() - taught,
    }
    return fitted


def embed_pairs(
    model: SentenceTransformer | StaticSurrogate,
    queries: Sequence[str],
    documents: Sequence[str],
    *,
    batch_size: int = 64,
    max_seq_length: int | None = None,
    show_progress_bar: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Embed queries (``encode_query``) and documents (``encode_document``) with a surrogate model.

    Args:
        model: a ``SentenceTransformer`` or a :class:`StaticSurrogate` (which embeds queries and documents alike).
        queries, documents: the two sides of the pairs, row-aligned.
        batch_size: encoding batch size of a transformer surrogate.
        max_seq_length: truncate texts to this many tokens (``None``: the model's own limit).
        show_progress_bar: progress bars while encoding (transformer surrogate).

    Returns:
        Two (N, D) float32 arrays, L2-normalised.
    """
    if len(queries) != len(documents):
        raise ValueError(f"Got {len(queries)} queries but {len(documents)} documents.")
    if isinstance(model, StaticSurrogate):
        if show_progress_bar:
            logger.info("Embedding %d queries and %d documents with the static surrogate", len(queries), len(documents))
        q_emb = model.encode(queries, max_seq_length=max_seq_length)
        timings = dict(model.timings)
        d_emb = model.encode(documents, max_seq_length=max_seq_length)
        model.timings = {key: timings[key] + model.timings[key] for key in timings}
        return q_emb, d_emb
    previous = model.max_seq_length
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    try:
        kwargs = dict(
            batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True, normalize_embeddings=True
        )
        if show_progress_bar:
            logger.info("Embedding %d queries and %d documents with the surrogate model", len(queries), len(documents))
        q_emb = model.encode_query(list(queries), **kwargs)
        d_emb = model.encode_document(list(documents), **kwargs)
    finally:
        model.max_seq_length = previous
    return np.asarray(q_emb, dtype=np.float32), np.asarray(d_emb, dtype=np.float32)


__all__ = [
    "SURROGATE_KINDS",
    "StaticSurrogate",
    "SurrogateKind",
    "distill_static_surrogate",
    "embed_pairs",
    "fit_static_surrogate",
    "load_static_surrogate",
]
