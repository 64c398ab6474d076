"""The context of a training batch: which of its documents fill the context slots, and which slots each pair may read.

During training a contextual model's context is the batch itself: the first stage embeds (up to ``context_size``
of) the batch's documents, the positive column as the collator tokenised it, and every row of the batch is encoded
against those vectors. The choice is seeded by the batch's tokens, so a batch always gets the same context whatever
the step counters say, and the gradient-cached replay sees the same context as the first pass.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from cde_st.context import sample_indices

_CONTEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def batch_seed(input_ids: Tensor, base_seed: int = 0) -> int:
    """A seed that depends only on a batch's tokens (and ``base_seed``): the same batch always samples the same
    context, whether it comes at step 3 or, after a resume, at step 0."""
    digest = hashlib.blake2b(input_ids.detach().cpu().numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") ^ base_seed


def batch_context_rows(num_documents: int, context_size: int, seed: int = 0) -> Tensor:
    """Which of a batch's ``num_documents`` documents fill its context, in slot order: all of them when they fit,
    else ``context_size`` sampled without replacement with :func:`cde_st.context.sample_indices` (seeded; batch
    order kept)."""
    if num_documents > context_size:
        return torch.as_tensor(sample_indices(num_documents, context_size, seed))
    return torch.arange(num_documents)


def context_visibility(document_features: dict[str, Any], rows: Tensor) -> Tensor:
    """(B, J') bool: may pair i read context slot s? False where the slot holds pair i's own document (or a copy
    of it, compared token by token), so a query cannot find its positive in the context (leave-one-out)."""
    ids = document_features["input_ids"].masked_fill(document_features["attention_mask"] == 0, 0)
    _, group = torch.unique(ids, dim=0, return_inverse=True)  # equal documents share a group
    return group[:, None] != group[rows.to(group.device)][None, :]


def batch_context(
    document_features: dict[str, Any],
    context_size: int,
    seed: int = 0,
    max_length: int | None = None,
    end_token_id: int | None = None,
) -> dict[str, Tensor]:
    """First-stage inputs made from a batch's tokenised documents: the context of that batch.

    All B documents when B <= ``context_size`` (the model null-pads the missing slots), else ``context_size`` of
    them sampled without replacement with :func:`cde_st.context.sample_indices` (seeded; batch order kept).
    Rows are truncated to ``max_length`` tokens (the last kept token of a cut row becomes ``end_token_id``, as
    the tokenizer's own truncation would do) and trailing all-padding columns are dropped.

    Args:
        document_features: the features of the document column as the collator produced them
            (``input_ids`` (B, L), ``attention_mask`` (B, L), optional ``token_type_ids``).
        context_size: J, the model's number of context slots.
        seed: sampling seed (only used when B > J).
        max_length: the first stage's token limit (``context_max_seq_length``), or None.
        end_token_id: the tokenizer's end-of-sequence token (``sep_token_id`` for BERT), or None.

    Returns:
        dict with ``input_ids``, ``attention_mask`` (and ``token_type_ids`` if given), each (min(B, J), L').

    Example:
        >>> features = model.preprocess(["doc a", "doc b", "doc c"], prompt=model.prompts["document"])  # doctest: +SKIP
        >>> batch_context(features, context_size=2, seed=0)["input_ids"].shape  # doctest: +SKIP
        torch.Size([2, 7])
    """
    ids, mask = document_features["input_ids"], document_features["attention_mask"]
    n = ids.shape[0]
    features = {k: document_features[k] for k in _CONTEXT_KEYS if isinstance(document_features.get(k), Tensor)}
    if n > context_size:
        keep = batch_context_rows(n, context_size, seed).to(ids.device)
        features = {k: v.index_select(0, keep) for k, v in features.items()}
        mask = features["attention_mask"]
    if max_length is not None and mask.shape[1] > max_length:
        cut = mask[:, max_length:].any(dim=1)
        features = {k: v[:, :max_length].clone() for k, v in features.items()}
        if end_token_id is not None and cut.any():
            features["input_ids"][cut, max_length - 1] = end_token_id
        mask = features["attention_mask"]
    active = mask.bool().any(dim=0).nonzero()
    width = int(active.max()) + 1 if len(active) else 1
    return {k: v[:, :width] for k, v in features.items()}


def carries_prompt(documents: dict[str, Any], document_prompt: str, tokenizer: Any) -> bool:
    """Whether a tokenised document column starts with ``document_prompt`` (as a trainer prompt, which records
    ``prompt_length``, or already written into the texts), or there is no document prompt: the training context
    should carry the prefix that ``set_context`` adds at inference."""
    if "prompt_length" in documents or not document_prompt:
        return True
    prompt_ids = tokenizer(document_prompt, add_special_tokens=False)["input_ids"]
    first = documents["input_ids"][0].tolist()
    return any(first[i : i + len(prompt_ids)] == prompt_ids for i in (0, 1))  # with or without a leading [CLS]
