"""``ClusteredBatchSampler``: contextual (clustered) batches for ``SentenceTransformerTrainer``.

The sampler checks its options and reads the domains and text columns of the dataset (``sampler_inputs.py``), has
the pairs clustered (:func:`~cde_st.batching.dataset_clustering.cluster_dataset`, on one process, shared with the
others), packs the clusters into batches (:func:`~cde_st.batching.pack_clusters`) and hands them out epoch by epoch
and rank by rank.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from sentence_transformers.base.data_collator import DEFAULT_LABEL_COLUMNS
from sentence_transformers.base.sampler import DefaultBatchSampler

from cde_st.batching.cache import default_cache_dir
from cde_st.batching.clustering import PairClustering
from cde_st.batching.dataset_clustering import ClusteringOptions, cluster_dataset
from cde_st.batching.packing import ClusterOrder, pack_clusters
from cde_st.batching.sampler_inputs import (
    check_int,
    check_static_source,
    check_surrogate,
    checked_cluster_size,
    checked_replicas,
    resolve_domains,
    surrogate_argument,
    text_columns,
)
from cde_st.batching.static_surrogate import StaticSurrogate
from cde_st.batching.surrogate import SurrogateKind
from cde_st.context import check_seed
from cde_st.distributed import world

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)


class ClusteredBatchSampler(DefaultBatchSampler):
    """Contextual batching (Morris & Rush, 2025, "Contextual Document Embeddings", section 3.1).

    Builds hard batches for contrastive losses with in-batch negatives (``MultipleNegativesRankingLoss``,
    ``CachedMultipleNegativesRankingLoss``, GIST, CDE's filtered InfoNCE): the (query, document) pairs are
    embedded by a surrogate model, clustered with faiss spherical k-means on their [q;d] / [d;q] points
    (k = pairs / ``cluster_size``) within each domain, and the clusters are packed into batches of exactly
    ``batch_size`` rows (big clusters split, small neighbouring ones merged, along a greedy nearest-centroid
    tour). Batch composition is fixed by ``seed``; the order of the batches is reshuffled every epoch from
    ``seed + epoch``. Every row appears exactly once per epoch; with ``drop_last=True`` the last, smaller batch
    of each domain is left out.

    Expected columns: the query and the positive document as text columns (by default the first two string
    columns, skipping label columns such as ``label``/``score``); further columns (e.g. hard negatives) are
    passed through untouched. Labels are not needed.

    Domains: pairs are only batched with pairs of the same domain. Give the domain of every row as
    ``domains=[...]`` or as ``domain_dataset=ds`` (a dataset with a ``domain_column``, row-aligned with the
    training dataset). Do **not** leave a domain column in the training dataset itself: the trainer's collator
    feeds every non-label column to the model as text. For a ``DatasetDict``, the trainer builds one sampler per
    split, so each split is a domain of its own (and ``multi_dataset_batch_sampler`` interleaves their
    batches); no option is needed.

    Distributed training: under ``SentenceTransformerTrainer``, accelerate hands batch ``i`` of this sampler
    to rank ``i % world_size``, so the sampler yields the *global* sequence of batches on every rank (the
    clustering is computed on rank 0 and broadcast, so all ranks agree) and every rank trains on its own,
    whole clustered batches. To keep the ranks in step, with more than one process the sampler yields only
    full batches, a multiple of ``world_size`` of them: with ``drop_last=True`` surplus batches are left out;
    otherwise each domain's short batch is topped up with other rows of its domain and the batch count is
    padded by repeating batches, as ``torch.utils.data.DistributedSampler`` does. Outside the trainer (a plain
    ``DataLoader`` per process), pass ``rank=`` to make the sampler keep only its own batches.

    Options passed with ``functools.partial`` live in ``args.batch_sampler``, which the trainer pickles into
    every checkpoint's ``training_args.bin``: prefer a surrogate path (the default) to a model instance, and a plain
    ``domains`` list to a large in-memory ``domain_dataset``; precomputed ``embeddings`` are stored there too.

    Caching: the clustering is stored under ``cache_dir`` (default ``~/.cache/cde_st/clusters``, or
    ``$CDE_ST_CACHE/clusters``), keyed by a hash of the texts, domains, surrogate and clustering parameters,
    so a restarted run does not embed or cluster again.

    Args:
        dataset: the training dataset (``datasets.Dataset``).
        batch_size: rows per batch.
        drop_last: leave out the short batch of each domain.
        valid_label_columns: label columns, never used as text (the trainer passes the collator's).
        generator: accepted for API compatibility; the order is drawn from ``seed + epoch`` instead, so every
            rank draws the same order whatever else consumed the generator.
        seed: seeds the clustering, the packing and (with the epoch) the batch order.
        cluster_size: target pairs per cluster; ``None`` uses ``batch_size`` (the paper's setting), clamped to
            the dataset size.
        surrogate: the model that embeds the pairs for the clustering (not the model being trained): a
            ``SentenceTransformer`` or a path / hub id; ``None`` is the offline all-MiniLM-L6-v2
            (``cde_st.defaults``). Loaded only when the clustering is not cached. A
            :class:`~cde_st.batching.StaticSurrogate` is used as is (a static surrogate).
        surrogate_kind: ``"transformer"`` embeds every pair with ``surrogate``. ``"static"`` (for large datasets on
            a CPU; ``pip install 'cde_st[fast-surrogate]'``) embeds them with a static-embedding model distilled
            from ``surrogate`` by model2vec (once, kept under ``$CDE_ST_CACHE/surrogates``, default
            ``~/.cache/cde_st/surrogates``), fitted to ``surrogate`` on ``static_fit_pairs`` random pairs and reduced
            to ``static_dims`` dimensions (:func:`~cde_st.batching.fit_static_surrogate`): about as hard batches,
            in minutes instead of hours for a million pairs (benchmarks/speed/RESULTS_sampler.md).
        static_fit_pairs: pairs the transformer embeds to fit the static surrogate (0: no transformer at all;
            measurably easier batches).
        static_dims: dimensions of the static surrogate's embeddings, i.e. of k-means (PCA).
        embeddings: precomputed ``(query_embeddings, document_embeddings)``, each (N, D), instead of a surrogate.
        query_column, document_column: the text columns; by default the first two string columns.
        domains: the domain of every row (a sequence of hashables).
        domain_dataset: a dataset, row-aligned with ``dataset``, whose ``domain_column`` holds the domains.
        domain_column: the domain column of ``domain_dataset`` (or of ``dataset`` itself, with a warning).
        order: ``"greedy"`` nearest-centroid cluster tour (paper) or ``"random"`` cluster order.
        niter: k-means iterations.
        max_points_per_centroid: k-means training subsample per centroid.
        encode_batch_size: surrogate encoding batch size.
        max_seq_length: truncate texts for the surrogate (faster; ``None`` keeps the surrogate's).
        device: device to load a surrogate given by path on.
        use_gpu: faiss on GPU; ``None`` uses one when available.
        cache: read and write the on-disk clustering cache.
        cache_dir: where to keep it.
        num_replicas: number of processes; ``None`` reads the torch.distributed world size.
        rank: yield only this rank's batches (batch ``i`` belongs to rank ``i % num_replicas``); leave ``None``
            under the trainer, where accelerate does this.
        show_progress_bar: progress bars for embedding and clustering.
        model: deprecated old name of ``surrogate`` (a ``DeprecationWarning``); checkpoints whose pickled options
            say ``model=`` still load.

    Example:
        ::

            from functools import partial

            from datasets import Dataset
            from sentence_transformers import (
                SentenceTransformer,
                SentenceTransformerTrainer,
                SentenceTransformerTrainingArguments,
            )
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

            from cde_st.defaults import default_surrogate_model_path
            from cde_st.batching import ClusteredBatchSampler

            model = SentenceTransformer(default_surrogate_model_path())
            data = Dataset.from_dict({
                "query": [f"question {i} about topic {i % 7}" for i in range(256)],
                "document": [f"an answer about topic {i % 7}, number {i}" for i in range(256)],
                "domain": ["forum" if i % 2 else "faq" for i in range(256)],
            })
            train_dataset = data.remove_columns("domain")  # the collator would feed it to the model
            args = SentenceTransformerTrainingArguments(
                output_dir="checkpoints",
                num_train_epochs=1,
                per_device_train_batch_size=32,
                # or domain_dataset=data: the same domains, read from its "domain" column
                # a plain list, read in one piece ([:]): the trainer saves these options with every checkpoint
                batch_sampler=partial(ClusteredBatchSampler, cluster_size=32, domains=data["domain"][:]),
            )
            trainer = SentenceTransformerTrainer(
                model=model,
                args=args,
                train_dataset=train_dataset,
                loss=MultipleNegativesRankingLoss(model),
            )
            trainer.train()
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        drop_last: bool,
        valid_label_columns: list[str] | None = None,
        generator: torch.Generator | None = None,
        seed: int = 0,
        *,
        cluster_size: int | None = None,
        surrogate: SentenceTransformer | StaticSurrogate | str | os.PathLike | None = None,
        surrogate_kind: SurrogateKind = ClusteringOptions.surrogate_kind,
        static_fit_pairs: int = ClusteringOptions.static_fit_pairs,
        static_dims: int = ClusteringOptions.static_dims,
        embeddings: tuple[np.ndarray, np.ndarray] | None = None,
        query_column: str | None = None,
        document_column: str | None = None,
        domains: Sequence[Hashable] | None = None,
        domain_dataset: Dataset | None = None,
        domain_column: str = "domain",
        order: ClusterOrder = "greedy",
        niter: int = ClusteringOptions.niter,
        max_points_per_centroid: int = ClusteringOptions.max_points_per_centroid,
        encode_batch_size: int = ClusteringOptions.encode_batch_size,
        max_seq_length: int | None = None,
        device: str | None = None,
        use_gpu: bool | None = None,
        cache: bool = True,
        cache_dir: str | os.PathLike | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        show_progress_bar: bool = True,
        model: SentenceTransformer | StaticSurrogate | str | os.PathLike | None = None,
    ) -> None:
        surrogate = surrogate_argument(surrogate, model)
        check_int("batch_size", batch_size, minimum=1)
        super().__init__(
            dataset,
            batch_size=int(batch_size),
            drop_last=drop_last,
            valid_label_columns=valid_label_columns,
            generator=generator,
            seed=seed,
        )
        self.dataset = dataset
        self.seed = check_seed(0 if seed is None else seed)
        if order not in ("greedy", "random"):
            raise ValueError(f"order must be 'greedy' or 'random', got {order!r}.")
        self.order = order
        num_rows = len(dataset)
        self.cluster_size = checked_cluster_size(cluster_size, self.batch_size, num_rows)
        self.num_replicas, self.rank = checked_replicas(num_replicas, rank)
        domain_values = resolve_domains(dataset, domains, domain_dataset, domain_column, num_rows)
        self._set_surrogate(surrogate, surrogate_kind, embeddings, static_fit_pairs, static_dims)
        label_columns = list(valid_label_columns or DEFAULT_LABEL_COLUMNS)
        embeddings = self._set_inputs(dataset, embeddings, query_column, document_column, label_columns, domain_column)
        self.cache_path: Path | None = None  # set by whichever process computes or loads the clustering
        self.timings = {"embed_s": 0.0, "cluster_s": 0.0}
        options = self._clustering_options(
            surrogate, niter, max_points_per_centroid, use_gpu, device, encode_batch_size, max_seq_length, cache,
            cache_dir, show_progress_bar,
        )  # fmt: skip
        self.clustering = self._get_clustering(dataset, options, embeddings, domain_values)
        self.batches = self._packed_batches()
        self._warned_padding = False

    # ---- construction helpers ------------------------------------------------------------------------------

    def _set_surrogate(
        self,
        surrogate: Any,
        surrogate_kind: SurrogateKind,
        embeddings: tuple[np.ndarray, np.ndarray] | None,
        static_fit_pairs: int,
        static_dims: int,
    ) -> None:
        """Check and set what embeds the pairs and how (a :class:`StaticSurrogate` given is used as one)."""
        check_surrogate(surrogate, surrogate_kind, embeddings, static_fit_pairs, static_dims)
        # What embeds the pairs (None: the default MiniLM); loaded only if the clustering is not cached.
        self.surrogate = surrogate
        self.surrogate_kind = "static" if isinstance(surrogate, StaticSurrogate) else surrogate_kind
        self.static_fit_pairs = int(static_fit_pairs)
        self.static_dims = int(static_dims)
        if self.surrogate_kind == "static" and embeddings is None:
            check_static_source(surrogate)

    def _packed_batches(self) -> list[np.ndarray]:
        """The clusters of :attr:`clustering` packed into batches of :attr:`batch_size` rows, in the cluster order."""
        return pack_clusters(
            self.clustering.labels,
            self.clustering.centroids,
            self.batch_size,
            cluster_domains=self.clustering.cluster_domains,
            order=self.order,
            seed=self.seed,
        )

    def _clustering_options(
        self,
        surrogate: Any,
        niter: int,
        max_points_per_centroid: int,
        use_gpu: bool | None,
        device: str | None,
        encode_batch_size: int,
        max_seq_length: int | None,
        cache: bool,
        cache_dir: str | os.PathLike | None,
        show_progress_bar: bool,
    ) -> ClusteringOptions:
        """What :func:`cluster_dataset` is asked for: the checked options set on the sampler and the others."""
        return ClusteringOptions(
            cluster_size=self.cluster_size,
            seed=self.seed,
            query_column=self.query_column,
            document_column=self.document_column,
            surrogate=surrogate,
            surrogate_kind=self.surrogate_kind,
            static_fit_pairs=self.static_fit_pairs,
            static_dims=self.static_dims,
            niter=int(niter),
            max_points_per_centroid=int(max_points_per_centroid),
            use_gpu=use_gpu,
            device=device,
            encode_batch_size=encode_batch_size,
            max_seq_length=max_seq_length,
            cache_dir=(Path(cache_dir) if cache_dir is not None else default_cache_dir()) if cache else None,
            show_progress_bar=show_progress_bar,
        )

    def _set_inputs(
        self,
        dataset: Dataset,
        embeddings: tuple[np.ndarray, np.ndarray] | None,
        query_column: str | None,
        document_column: str | None,
        label_columns: list[str],
        domain_column: str,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Set the text columns (none with precomputed ``embeddings``, whose shape is checked); the embeddings."""
        if embeddings is None:
            self.query_column, self.document_column = text_columns(
                dataset, query_column, document_column, label_columns, domain_column
            )
            return None
        q_emb, d_emb = embeddings = tuple(np.asarray(e) for e in embeddings)
        num_rows = len(dataset)
        if q_emb.ndim != 2 or q_emb.shape != d_emb.shape or len(q_emb) != num_rows:
            raise ValueError(
                f"embeddings must be two arrays of shape ({num_rows}, dim), one row per dataset row; "
                f"got {q_emb.shape} and {d_emb.shape}."
            )
        self.query_column = self.document_column = None
        if query_column is not None or document_column is not None:
            text_columns(dataset, query_column, document_column, label_columns, domain_column)
        return embeddings

    def _get_clustering(
        self,
        dataset: Dataset,
        options: ClusteringOptions,
        embeddings: tuple[np.ndarray, np.ndarray] | None,
        domains: list[Hashable] | None,
    ) -> PairClustering:
        """The pairs' clustering (:func:`cluster_dataset` with ``options``), the same on every rank: one process
        clusters and the others receive the result (independent k-means runs may differ in the last bits and so in a
        few assignments, and every rank must pack the same batches)."""
        world_size, rank = world()
        clustering = None
        if world_size == 1 or rank == 0:
            result = cluster_dataset(dataset, options, embeddings=embeddings, domains=domains)
            self.cache_path, self.timings = result.cache_path, result.timings
            clustering = result.clustering
        if world_size > 1:
            payload: list[Any] = [clustering]
            torch.distributed.broadcast_object_list(payload, src=0)
            clustering = payload[0]
        if len(clustering.labels) != len(dataset):  # pragma: no cover - defensive
            raise RuntimeError("The clustering does not cover the dataset.")
        return clustering

    # ---- iteration -----------------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """The global batch order of an epoch (all ranks), before any ``rank=`` selection."""
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng(self.seed + epoch)
        full = [b for b in self.batches if len(b) == self.batch_size]
        short = [b for b in self.batches if len(b) < self.batch_size]
        # Short batches go last: accelerate's BatchSamplerShard assumes only the final batch may be short.
        ordered = [full[i] for i in rng.permutation(len(full))]
        if self.num_replicas == 1:
            if not self.drop_last:
                ordered += [short[i] for i in rng.permutation(len(short))]
            return [b.tolist() for b in ordered]

        # Several processes: only full batches, a multiple of num_replicas of them, so no rank waits for another.
        if not self.drop_last:
            ordered += [self._top_up(short[i], rng) for i in rng.permutation(len(short))]
        surplus = len(ordered) % self.num_replicas
        if surplus and self.drop_last:
            ordered = ordered[: len(ordered) - surplus]
        elif surplus:
            missing = self.num_replicas - surplus
            ordered += [ordered[i % len(ordered)] for i in range(missing)]
        if not self.drop_last and not self._warned_padding and (short or surplus):
            self._warned_padding = True
            logger.warning(
                "ClusteredBatchSampler: to give %d processes equal numbers of full batches, some rows are repeated "
                "within an epoch (as torch's DistributedSampler does). Set drop_last=True to drop them instead.",
                self.num_replicas,
            )
        return [b.tolist() for b in ordered]

    def _top_up(self, batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Fill a short batch with other rows of its own domain (repeating rows only if the domain is too small)."""
        domain = self.clustering.cluster_domains[self.clustering.labels[batch[0]]]
        same_domain = np.flatnonzero(self.clustering.cluster_domains[self.clustering.labels] == domain)
        others = np.setdiff1d(same_domain, batch, assume_unique=True)
        need = self.batch_size - len(batch)
        if len(others) >= need:
            extra = rng.choice(others, need, replace=False)
        else:
            extra = rng.choice(same_domain, need, replace=True)
        return np.concatenate([batch, extra])

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.epoch_batches()
        if self.rank is not None:
            batches = batches[self.rank :: self.num_replicas]
        yield from batches

    def __len__(self) -> int:
        full = sum(len(b) == self.batch_size for b in self.batches)
        total = full if self.drop_last else len(self.batches)
        n = self.num_replicas
        if n > 1:
            total = total // n * n if self.drop_last else -(-total // n) * n
            if self.rank is not None:
                total //= n
        return total


__all__ = ["ClusteredBatchSampler"]
