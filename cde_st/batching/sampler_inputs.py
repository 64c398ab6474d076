"""What :class:`~cde_st.batching.ClusteredBatchSampler` reads from its arguments and its dataset: each option
checked (an error that names it), the domain of every row and the (query, document) text columns."""

from __future__ import annotations

import os
import warnings
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cde_st.batching.static_surrogate import StaticSurrogate
from cde_st.batching.surrogate import SURROGATE_KINDS, import_model2vec
from cde_st.data import as_list, column
from cde_st.distributed import world

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "RESERVED_COLUMNS",
    "check_int",
    "check_static_source",
    "check_surrogate",
    "checked_cluster_size",
    "checked_replicas",
    "resolve_domains",
    "surrogate_argument",
    "text_columns",
]

# Added by the trainer to multi-dataset inputs; never a text column.
RESERVED_COLUMNS = ("dataset_name", "return_loss")


def surrogate_argument(surrogate: Any, model: Any) -> Any:
    """``surrogate``, or ``model`` (its deprecated old name, with a ``DeprecationWarning``)."""
    if model is None:
        return surrogate
    if surrogate is not None:
        raise ValueError("Give the clustering surrogate once, as `surrogate=` (`model=` is its old name).")
    warnings.warn(
        "ClusteredBatchSampler(model=...) is deprecated: that argument is the clustering surrogate, not the "
        "model being trained; use surrogate=... instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    return model


def check_int(name: str, value: Any, minimum: int | None = None) -> None:
    """A ValueError naming ``name`` unless ``value`` is an integer (not a bool), at least ``minimum`` if given."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        what = "a positive integer" if minimum == 1 else "an integer"
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(
            f"{name} must be a positive integer, got {value!r}."
            if minimum == 1
            else f"{name} must be >= {minimum}, got {value}."
        )


def checked_cluster_size(cluster_size: int | None, batch_size: int, num_rows: int) -> int:
    """The target cluster size: ``batch_size`` (the paper's choice) by default, within [1, rows]."""
    if num_rows == 0:
        raise ValueError("ClusteredBatchSampler got an empty dataset: there are no pairs to cluster.")
    if cluster_size is None:
        cluster_size = min(batch_size, num_rows)
    elif not isinstance(cluster_size, (int, np.integer)) or isinstance(cluster_size, bool):
        raise ValueError(f"cluster_size must be an integer, got {cluster_size!r}.")
    if cluster_size < 1 or cluster_size > num_rows:
        raise ValueError(
            f"cluster_size must be between 1 and the number of rows in the dataset ({num_rows}), got {cluster_size}."
        )
    return int(cluster_size)


def checked_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int | None]:
    """The number of processes (default: the torch.distributed world size) and the rank to keep, if any."""
    world_size, _ = world()
    num_replicas = world_size if num_replicas is None else int(num_replicas)
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}.")
    if rank is not None and not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}.")
    return num_replicas, rank


def check_surrogate(
    surrogate: Any,
    surrogate_kind: Any,
    embeddings: Any,
    static_fit_pairs: Any,
    static_dims: Any,
) -> None:
    """The surrogate options: a surrogate or embeddings (not both), a known kind, the static surrogate's sizes."""
    if embeddings is not None and surrogate is not None:
        raise ValueError("Give either a `surrogate` or precomputed `embeddings`, not both.")
    if surrogate_kind not in SURROGATE_KINDS:
        raise ValueError(f"surrogate_kind must be one of {SURROGATE_KINDS}, got {surrogate_kind!r}.")
    check_int("static_dims", static_dims, minimum=1)
    check_int("static_fit_pairs", static_fit_pairs, minimum=0)


def check_static_source(surrogate: Any) -> None:
    """A static surrogate is distilled from a path (or given ready); model2vec must be installed (say so now, not
    after reading the dataset)."""
    if surrogate is not None and not isinstance(surrogate, (str, os.PathLike, StaticSurrogate)):
        raise ValueError(
            "surrogate_kind='static' distils the surrogate from a model folder or hub id: pass its path as "
            f"surrogate= (or a StaticSurrogate), not a loaded {type(surrogate).__name__}."
        )
    import_model2vec()


def resolve_domains(
    dataset: Dataset,
    domains: Sequence[Hashable] | None,
    domain_dataset: Dataset | None,
    domain_column: str,
    num_rows: int,
) -> list[Hashable] | None:
    """The domain of every row: ``domains``, or ``domain_dataset``'s ``domain_column`` (row-aligned), or (with a
    warning: the collator would feed it to the model) the training dataset's own ``domain_column``; None: one
    domain."""
    if domains is not None and domain_dataset is not None:
        raise ValueError("Give the domains either as `domains=` or through `domain_dataset=`, not both.")
    if domain_dataset is not None:
        if domain_column not in domain_dataset.column_names:
            raise ValueError(
                f"domain_dataset has no column {domain_column!r} (columns: {domain_dataset.column_names}); "
                "set domain_column= to the column holding the domains."
            )
        if len(domain_dataset) != num_rows:
            raise ValueError(
                f"domain_dataset has {len(domain_dataset)} rows but the dataset to sample has {num_rows}; "
                "they must be row-aligned (pass the dataset before removing its domain column)."
            )
        return column(domain_dataset, domain_column)
    if domains is not None:
        domains = as_list(domains)
        if len(domains) != num_rows:
            raise ValueError(f"Got {len(domains)} domains for a dataset of {num_rows} rows; give one per row.")
        return domains
    if domain_column in getattr(dataset, "column_names", []):
        warnings.warn(
            f"ClusteredBatchSampler reads domains from the dataset's {domain_column!r} column, but "
            "SentenceTransformerTrainer's collator would also feed that column to the model as text. "
            f"Remove it from the training dataset and pass `domain_dataset=` or `domains=` instead.",
            stacklevel=3,
        )
        return column(dataset, domain_column)
    return None


def text_columns(
    dataset: Dataset,
    query_column: str | None,
    document_column: str | None,
    label_columns: list[str],
    domain_column: str,
) -> tuple[str, str]:
    """The (query, document) text columns: the ones given (checked), else the first two string columns that are
    not labels, reserved or the domain column."""
    columns = list(getattr(dataset, "column_names", None) or [])
    for name, given in (("query_column", query_column), ("document_column", document_column)):
        if given is not None and given not in columns:
            raise ValueError(f"{name}={given!r} is not a column of the dataset (columns: {columns}).")
    features = getattr(dataset, "features", None) or {}
    skip = set(label_columns) | set(RESERVED_COLUMNS) | {domain_column}
    text_columns = [
        c for c in columns if c not in skip and getattr(features.get(c), "dtype", None) in ("string", "large_string")
    ]
    if query_column is None:
        candidates = [c for c in text_columns if c != document_column]
        if not candidates:
            raise ValueError(f"Could not find a text column for the queries in the dataset (columns: {columns}).")
        query_column = candidates[0]
    if document_column is None:
        candidates = [c for c in text_columns if c != query_column]
        if not candidates:
            raise ValueError(
                f"Could not find a second text column for the documents in the dataset (columns: {columns}); "
                "the sampler needs (query, document) pairs."
            )
        document_column = candidates[0]
    if query_column == document_column:
        raise ValueError(f"query_column and document_column are both {query_column!r}.")
    return query_column, document_column
