"""Surrogate embeddings of the pairs, the input of the clustering, and the surrogates that make them.

Two kinds of surrogate:

- ``"transformer"`` (the default): a ``SentenceTransformer`` (all-MiniLM-L6-v2 unless told otherwise), run as is.
- ``"static"``: a :class:`~cde_st.batching.static_surrogate.StaticSurrogate` distilled from that transformer with
  model2vec (Tulkens & van Dongen, 2024, https://github.com/MinishLab/model2vec): every vocabulary token is
  embedded once by the transformer, the token table is reduced with PCA, and a text is the mean of its tokens'
  rows. The distilled model is cached on disk, keyed by the source model's fingerprint, so it is distilled once;
  :func:`fit_static_surrogate` then fits it to the transformer on a sample of the pairs to be clustered.

model2vec is an optional dependency (``pip install 'cde_st[fast-surrogate]'``): it is imported only where a static
surrogate is distilled or loaded, so that the transformer surrogate works without it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from sentence_transformers import SentenceTransformer

from cde_st.atomic_files import write_folder_atomically
from cde_st.batching.cache import default_surrogate_cache_dir, embedding_cache_key
from cde_st.batching.static_surrogate import StaticSurrogate
from cde_st.defaults import default_surrogate_model_path

logger = logging.getLogger(__name__)

SurrogateKind = Literal["transformer", "static"]
SURROGATE_KINDS: tuple[str, ...] = ("transformer", "static")

# PCA dimensions of the distilled token table (model2vec's default).
_DISTILL_DIMS = 256
# Pairs whose static embeddings fit the PCA when there is no teacher (fit_pairs=0).
_PCA_SAMPLE_PAIRS = 16_384
_INSTALL_HINT = "pip install 'cde_st[fast-surrogate]'  (model2vec and skeletoken, its distillation dependency)"


def import_model2vec(for_distillation: bool = False) -> Any:
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


def _not_a_model(model: str | os.PathLike, exc: Exception) -> ValueError:
    """The error for a surrogate= that cannot be loaded as a model."""
    path = os.fspath(model)
    where = "does not exist" if not os.path.exists(path) and os.path.isabs(path) else "cannot be loaded as a model"
    return ValueError(
        f"The surrogate model {path!r} {where} ({type(exc).__name__}: {str(exc)[:300]}). surrogate= must be a "
        "sentence-transformers or Hugging Face model folder (config.json, weights and tokenizer files) or a hub id "
        "(cached when offline); leave it unset for the offline all-MiniLM-L6-v2."
    )


def load_transformer_surrogate(model: str | os.PathLike, device: str | None = None) -> SentenceTransformer:
    """The transformer surrogate at ``model`` (folder or hub id), in eval mode; a folder that holds no model is an
    error naming it as the surrogate."""
    try:
        loaded = SentenceTransformer(os.fspath(model), device=device)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _not_a_model(model, exc) from None
    loaded.eval()
    return loaded


def _damaged_files(folder: Path) -> list[str]:
    """The files of a model2vec folder that cannot be parsed (JSON files, safetensors headers)."""
    from safetensors import safe_open

    damaged = []
    for path in sorted(folder.iterdir()):
        try:
            if path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="numpy") as f:
                    list(f.keys())
        except Exception:  # noqa: BLE001 - any failure to parse the file is what is reported
            damaged.append(path.name)
    return damaged


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
            all-MiniLM-L6-v2 (``cde_st.defaults``).
        dims: PCA dimensions of the token table (at most the model's hidden size).
        cache_dir: where distilled models are kept.
        device: where the distillation forward passes run (model2vec picks one when ``None``).

    Returns:
        The folder of the distilled model (model2vec format).
    """
    if model is None:
        model = default_surrogate_model_path()
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"distill_static_surrogate needs a model folder or hub id, got {type(model).__name__}; "
            "save the model and pass its folder."
        )
    if not isinstance(dims, int) or isinstance(dims, bool) or dims < 1:
        raise ValueError(f"dims must be a positive integer, got {dims!r}.")
    model2vec = import_model2vec(for_distillation=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_surrogate_cache_dir()
    key = embedding_cache_key(os.fspath(model))[:24]
    folder = cache_dir / f"static-{key}-d{dims}-m2v{model2vec.__version__}"
    if (folder / "config.json").exists():
        return folder

    from model2vec.distill import distill

    logger.info("Distilling a %d-d static surrogate from %s (once; cached in %s)", dims, os.fspath(model), folder)
    start = time.perf_counter()
    try:
        static = distill(model_name=os.fspath(model), pca_dims=dims, device=device)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _not_a_model(model, exc) from None
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
    model2vec = import_model2vec()
    folder = distill_static_surrogate(model, dims=dims, cache_dir=cache_dir, device=device)
    source = None if model is None else os.fspath(model)
    try:
        static = model2vec.StaticModel.from_pretrained(os.fspath(folder))
    except Exception as exc:  # noqa: BLE001 - model2vec and tokenizers raise bare Exceptions for damaged files
        damaged = _damaged_files(Path(folder))
        files = f"damaged: {', '.join(damaged)}" if damaged else f"{type(exc).__name__}: {str(exc)[:200]}"
        raise ValueError(
            f"The static surrogate cached in {folder} (distilled from {source or default_surrogate_model_path()}) "
            f"cannot be read ({files}; an interrupted write or copy). Delete {folder}: the next run distils it "
            "again."
        ) from None
    return StaticSurrogate.from_model2vec(static, source=source)


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
        model = default_surrogate_model_path()
    start = time.perf_counter()
    static = load_static_surrogate(model, cache_dir=cache_dir, device=device)
    loaded = time.perf_counter()

    sample_queries, sample_documents = _fit_sample(queries, documents, fit_pairs, seed)
    targets, max_seq_length = _teacher_targets(
        model, sample_queries, sample_documents, fit_pairs, max_seq_length, device, encode_batch_size, show_progress_bar
    )
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


def _fit_sample(
    queries: Sequence[str], documents: Sequence[str], fit_pairs: int, seed: int
) -> tuple[list[str], list[str]]:
    """The pairs :func:`fit_static_surrogate` fits to, drawn with ``seed`` (in data order; a missing text is "")."""
    rng = np.random.default_rng(seed)
    # Without a teacher the sample only fits the PCA; its size then costs next to nothing.
    sample_size = min(len(queries), fit_pairs if fit_pairs > 0 else _PCA_SAMPLE_PAIRS)
    rows = np.sort(rng.choice(len(queries), sample_size, replace=False))
    sample_queries = ["" if queries[i] is None else queries[i] for i in rows]
    sample_documents = ["" if documents[i] is None else documents[i] for i in rows]
    return sample_queries, sample_documents


def _teacher_targets(
    model: str | os.PathLike,
    sample_queries: list[str],
    sample_documents: list[str],
    fit_pairs: int,
    max_seq_length: int | None,
    device: str | None,
    encode_batch_size: int,
    show_progress_bar: bool,
) -> tuple[np.ndarray | None, int]:
    """The transformer's embeddings of the sample, queries then documents (None with ``fit_pairs=0``), and the
    token limit (``max_seq_length``, else the transformer's own; the transformer is loaded only when needed)."""
    targets = None
    if fit_pairs > 0 or max_seq_length is None:
        teacher = load_transformer_surrogate(model, device=device)
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
    return targets, max_seq_length


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
    "SurrogateKind",
    "distill_static_surrogate",
    "embed_pairs",
    "fit_static_surrogate",
    "import_model2vec",
    "load_static_surrogate",
    "load_transformer_surrogate",
]
