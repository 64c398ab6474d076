"""FilteredInfoNCELoss: InfoNCE with guide-filtered in-batch negatives and two-stage gradient caching.

The contrastive objective of Contextual Document Embeddings (Morris & Rush, ICLR 2025):

    loss_i = -log  exp(s(q_i, d_i) / tau) / sum_{c in C_i} exp(s(q_i, c) / tau)

with cosine similarity s, tau = 0.02, and candidates C_i = the batch's documents and hard negatives minus the
in-batch documents a frozen guide model scores at least as relevant to q_i as q_i's own positive (likely false
negatives). For a contextual model the batch's documents are also the second stage's context: the first stage
embeds them once per batch and every row of the batch is encoded against that context.

Gradient caching (GradCache, Gao et al. 2021) extended to two stages, so that the batch size is bounded by time,
not memory:

    1. no grad, chunk by chunk: first stage over the context documents -> context (J, d);
       second stage over every column with that context -> embeddings (B, d) per column
    2. the loss over all embeddings, back-propagated to the embeddings only (cached gradients)
    3. in the backward pass: replay the second stage chunk by chunk with grad, pushing the cached gradients into
       M2's weights and into a leaf copy of the context, whose gradient accumulates over all chunks; then replay
       the first stage chunk by chunk and push that context gradient into M1's weights.

Each replay restores the RNG state of its first pass (``RandContext``), so dropout and sequence dropout draw
the same masks and the gradients are those of the embeddings the loss saw.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses import CachedLossMixin, RandContext

# Private helpers of sentence-transformers' GradCache machinery (pinned by the project's `<7` bound): the
# mini-batch slicer (trims padding per chunk), the range splitter and the backward hook that replays a column.
from sentence_transformers.base.losses.gradcache import (
    _backward_hook,
    _create_minibatch,
    _get_batch_size,
    _minibatch_ranges,
)
from sentence_transformers.util import batch_to_device, cos_sim
from torch import Tensor, nn

from cde_st.context import sample_indices
from cde_st.distributed import average_gradients, ddp_wrapper, gather_rows, scatter_gradient, unwrap_ddp, world
from cde_st.model import contextual_module, is_contextual
from cde_st.modules.contextual_transformer import ContextualTransformer

logger = logging.getLogger(__name__)

# Guide scores of identical texts can differ in the last float bit; "as relevant as the positive" must catch them.
_SCORE_TOLERANCE = 1e-6
_CONTEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def false_negative_mask(
    guide_queries: Tensor,
    guide_documents: Tensor,
    margin: float = 0.0,
    positive_index: Tensor | None = None,
    positive_scores: Tensor | None = None,
) -> Tensor:
    """Which candidates a frozen guide marks as likely false negatives.

    Row i (a query, or a document in the bidirectional loss) and candidate j are scored by the guide's cosine
    similarity f(i, j). Candidate j is removed from row i's denominator when

        f(i, j) >= f(q_i, d_i) - margin

    where f(q_i, d_i) is the guide's score of row i's own positive pair: column ``positive_index[i]`` of this
    matrix, or ``positive_scores[i]`` when given (same-side candidates, where the positive is not a column).
    The positive columns ``positive_index`` are never removed.

    Args:
        guide_queries: (n, d_g) guide embeddings of the rows.
        guide_documents: (m, d_g) guide embeddings of the candidates.
        margin: how far below the positive's score a candidate is still removed (0 = only candidates at least as
            relevant as the positive).
        positive_index: (n,) column of each row's positive, or None.
        positive_scores: (n,) guide score f(q_i, d_i) of each row's positive pair, or None (then read from
            ``positive_index``).

    Returns:
        (n, m) bool tensor, True where the logit must be removed (set to -inf).

    Example:
        >>> g = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), dim=-1)
        >>> false_negative_mask(g, g, positive_index=torch.arange(3))  # rows 0 and 2 are duplicates
        tensor([[False, False,  True],
                [False, False, False],
                [ True, False, False]])
    """
    if positive_index is None and positive_scores is None:
        raise ValueError("Give positive_index or positive_scores: the threshold is the positive pair's guide score.")
    scores = cos_sim(guide_queries, guide_documents)  # (n, m)
    rows = torch.arange(scores.shape[0], device=scores.device)
    if positive_scores is None:
        positive_scores = scores[rows, positive_index]
    mask = scores >= (positive_scores.to(scores.dtype) - margin - _SCORE_TOLERANCE).unsqueeze(1)
    if positive_index is not None:
        mask[rows, positive_index] = False
    return mask


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
        >>> features = model.preprocess(["doc a", "doc b", "doc c"], prompt="search_document: ")  # doctest: +SKIP
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


class FilteredInfoNCELoss(CachedLossMixin, nn.Module):
    """InfoNCE with guide-filtered in-batch negatives, for plain and contextual models, with optional
    two-stage gradient caching: the training objective of Contextual Document Embeddings
    (Morris & Rush, ICLR 2025, https://arxiv.org/abs/2410.02525).

    For each query q_i with positive d_i the loss is the cross-entropy of d_i among the batch's documents and
    hard negatives, over cosine similarities divided by ``temperature``. A frozen guide model removes from q_i's
    denominator every in-batch document d_j with f(q_i, d_j) >= f(q_i, d_i) - ``margin`` (likely false
    negatives, e.g. duplicates or other relevant documents); the positive itself and the hard-negative columns
    are never removed.

    With a :class:`~cde_st.ContextualSentenceTransformer` the batch's documents (the positive column) are also
    the context: the first stage embeds them once per batch (``context_size`` of them, sampled with a seed
    derived from the batch, when the batch is larger; null slots when smaller) and every column is encoded by
    the second stage against that context. Keep the batch's documents and the context consistent by giving the
    document column the document prompt (``SentenceTransformerTrainingArguments(prompts=...)``): the context
    uses the column's tokens as they are, truncated to ``context_max_seq_length``.

    With ``mini_batch_size`` (and/or ``context_mini_batch_size``) set, both stages run chunk by chunk without
    grad, the loss gradient w.r.t. the embeddings is cached, and both stages are replayed chunk by chunk in the
    backward pass (second stage first, which yields the gradient of the context; then the first stage). Activation
    memory is then that of one chunk whatever the batch size (only the (B, d) embeddings and their gradients grow
    with B), and the gradients equal the uncached ones up to float rounding (with dropout or sequence dropout on,
    each chunk draws its own masks, so the two modes sample different masks).

    Args:
        model: a ``SentenceTransformer`` or ``ContextualSentenceTransformer``.
        guide: the frozen guide scoring false negatives: a ``SentenceTransformer``, None for the default
            (the offline all-MiniLM-L6-v2, via ``cde_st._defaults.load_default_surrogate``), or False for no
            filtering. The guide is put in eval mode, frozen, and kept out of the loss's submodules, so it
            never reaches an optimizer. It reads the texts decoded from the model's tokens (prompt removed).
        temperature: tau; logits are cos / tau (paper: 0.02, i.e. scale 50).
        margin: filtering margin (0: remove only in-batch documents the guide ranks at least as high as the
            positive; larger removes more).
        mini_batch_size: second-stage chunk size for gradient caching (None: no caching unless
            ``context_mini_batch_size`` is set, then the second stage runs as one chunk).
        context_mini_batch_size: first-stage chunk size for gradient caching; defaults to ``mini_batch_size``.
        bidirectional: add the GTE-style terms (Li et al. 2023, https://arxiv.org/abs/2308.03281): q_i's
            denominator also holds the other queries q_j, and, from d_i's side, the other queries q_j and the
            other documents d_j (a joint partition; each distinct pair appears once). The guide filters these
            too, each against the positive pair's score f(q_i, d_i).
        filter_false_negatives: False disables the guide (plain InfoNCE; no guide is loaded).
        context_seed: base seed of the context sampling (the per-batch seed also hashes the batch's tokens, so
            a batch always gets the same context, independent of step counters).
        context_dropout: probability that a batch's context is cut to a uniformly drawn J' in {0, ..., n - 1} of
            its n documents, the remaining slots null (not in the paper). Teaches the model partial and empty
            contexts, so that it stays a good bi-encoder with J = 0 instead of collapsing. The draw is seeded by
            the batch's tokens and a call counter, so the cached and uncached paths see the same context.
        leave_one_out: hide from every row of pair i the context slot that holds its own document d_i (not in
            the paper). Without it the training context contains each query's positive, which the query can read
            (a shortcut that does not exist at test time, where the context is a sample of the corpus). In
            ``context_attention="cached"`` mode the slot is hidden from the text; the other context rows, which
            attend to it inside the context, still carry some of it.
        gather_across_devices: under data-parallel training (torchrun / accelerate launch), also use every other
            rank's queries, documents and hard negatives as candidates (cross-rank negatives; each rank keeps its
            own batch's context). Off by default, as in the paper: a clustered batch's negatives are the hard ones,
            while other ranks' batches come from other clusters. Without a process group it changes nothing.

    Data-parallel training: give the loss the model as the trainer wraps it (the trainer does this itself). Both
    stages run behind the DistributedDataParallel wrapper and, once the backward pass has replayed every chunk of
    both stages, all gradients are averaged across ranks in one collective (:mod:`cde_st.distributed`), so the
    first stage is synchronised too, with or without gradient caching.

    References:
        - Contextual Document Embeddings (Morris & Rush, ICLR 2025): https://arxiv.org/abs/2410.02525
        - Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup (GradCache):
          https://arxiv.org/abs/2101.06983

    Requirements:
        1. (anchor, positive) pairs or (anchor, positive, negative_1, ..., negative_n) tuples; the positive
           (second) column holds the documents, which are also the contextual model's context.
        2. Clustered, hard batches (``cde_st.sampler``) make in-batch negatives informative; the guide then
           removes the false negatives that clustering brings in.

    Inputs:
        +-------------------------------------------------+--------+
        | Inputs                                          | Labels |
        +=================================================+========+
        | (anchor, positive) pairs                        | none   |
        +-------------------------------------------------+--------+
        | (anchor, positive, negative_1, ..., negative_n) | none   |
        +-------------------------------------------------+--------+

    Relations:
        - Without guide and without caching this is :class:`~sentence_transformers.losses.MultipleNegativesRankingLoss`
          at scale 1/tau; with a guide it resembles :class:`~sentence_transformers.losses.GISTEmbedLoss`
          (which thresholds q-d, q-q and d-d similarities the same way).
        - Composes with :class:`~sentence_transformers.losses.MatryoshkaLoss` in both modes: the loss always
          back-propagates from a hook (``uses_gradient_cache`` is True), so MatryoshkaLoss decorates
          :meth:`calculate_loss` and never patches ``model.forward`` (whose patch drops ``dataset_embeddings``).

    Example:
        ::

            from datasets import Dataset
            from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

            from cde_st import ContextualSentenceTransformer
            from cde_st.losses import FilteredInfoNCELoss

            model = ContextualSentenceTransformer.from_encoder("sentence-transformers/all-MiniLM-L6-v2", context_size=64)
            train_dataset = Dataset.from_dict({
                "anchor": ["what causes rain?", "who wrote hamlet?", "how do vaccines work?"],
                "positive": [
                    "Rain forms when water vapour condenses into droplets.",
                    "Hamlet is a tragedy written by William Shakespeare.",
                    "Vaccines train the immune system to recognise a pathogen.",
                ],
            })
            loss = FilteredInfoNCELoss(model, mini_batch_size=32)
            args = SentenceTransformerTrainingArguments(
                output_dir="cde-out",
                per_device_train_batch_size=512,
                prompts={"anchor": "search_query: ", "positive": "search_document: "},
            )
            trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
            trainer.train()
    """

    def __init__(
        self,
        model: SentenceTransformer,
        guide: SentenceTransformer | bool | None = None,
        temperature: float = 0.02,
        margin: float = 0.0,
        mini_batch_size: int | None = None,
        context_mini_batch_size: int | None = None,
        bidirectional: bool = False,
        filter_false_negatives: bool = True,
        context_seed: int = 0,
        context_dropout: float = 0.0,
        gather_across_devices: bool = False,
        leave_one_out: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= context_dropout <= 1.0:
            raise ValueError(f"context_dropout must be in [0, 1], got {context_dropout}.")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        if not -2.0 < margin < 2.0:  # also false for NaN
            raise ValueError(
                f"margin must be a finite number in (-2, 2), got {margin}: guide scores are cosines in [-1, 1], so a "
                "margin >= 2 filters every in-batch negative (loss 0) and NaN none; to turn filtering off pass "
                "filter_false_negatives=False."
            )
        for name, value in (("mini_batch_size", mini_batch_size), ("context_mini_batch_size", context_mini_batch_size)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer or None, got {value}.")
        self.model = model
        self.temperature = temperature
        self.margin = margin
        self.mini_batch_size = mini_batch_size
        self.context_mini_batch_size = context_mini_batch_size or mini_batch_size
        self.bidirectional = bidirectional
        self.context_seed = context_seed
        self.context_dropout = context_dropout
        self.leave_one_out = leave_one_out
        self.gather_across_devices = gather_across_devices
        self._context_calls = 0
        self._warned_unprompted_context = False

        if not filter_false_negatives or guide is False:
            guide = None
        elif guide is None or guide is True:
            from cde_st._defaults import load_default_surrogate

            guide = load_default_surrogate(device=str(model.device))
        if guide is not None:
            if guide is model:
                raise ValueError("The guide must be a separate, frozen model, not the model being trained.")
            if not hasattr(model, "tokenizer") or model.tokenizer is None:
                raise ValueError("False-negative filtering decodes the model's tokens: the model needs a tokenizer.")
            guide.eval()
            guide.requires_grad_(False)
        # A tuple, not an attribute: nn.Module would register the guide as a submodule, and the trainer builds its
        # optimizer from the loss's parameters (and calls .train() on it).
        self._guide: tuple[SentenceTransformer, ...] = (guide,) if guide is not None else ()

    # ------------------------------------------------------------------ properties
    @property
    def guide(self) -> SentenceTransformer | None:
        """The frozen guide model, or None when filtering is off."""
        return self._guide[0] if self._guide else None

    @property
    def filter_false_negatives(self) -> bool:
        return bool(self._guide)

    @property
    def cached(self) -> bool:
        """Whether gradient caching (chunked no-grad passes + replay) is on."""
        return self.mini_batch_size is not None or self.context_mini_batch_size is not None

    @property
    def scale(self) -> float:
        return 1.0 / self.temperature

    # ------------------------------------------------------------------ model access
    @property
    def _net(self) -> nn.Module:
        """The model the loss runs: ``self.model`` behind a DistributedDataParallel wrapper, if any. Both stages
        run outside DDP's forward and :func:`cde_st.distributed.average_gradients` synchronises them after the
        backward hook (see :mod:`cde_st.distributed`)."""
        return unwrap_ddp(self.model)

    def _contextual_module(self) -> ContextualTransformer | None:
        """The ContextualTransformer of the (possibly compiled or DDP-wrapped) model, or None for a plain model."""
        model = getattr(self._net, "_orig_mod", self._net)
        return contextual_module(model) if is_contextual(model) else None

    def _synchronize_gradients(self) -> None:
        """Under DDP, average every gradient across ranks once both stages have received theirs."""
        ddp = ddp_wrapper(self.model)
        if ddp is not None:
            average_gradients(ddp)

    # ------------------------------------------------------------------ batch preparation
    def _guide_embeddings(self, features: list[dict[str, Any]]) -> list[Tensor]:
        """Normalised guide embeddings (B, d_g) of the anchor and positive columns, from their decoded texts."""
        guide = self.guide
        tokenizer = getattr(self._net, "_orig_mod", self._net).tokenizer
        chunk = self.mini_batch_size or 128
        guide.eval()
        out = []
        for feature in features[:2]:
            texts = _decode_texts(feature, tokenizer)
            vectors = []
            with torch.no_grad():
                for start in range(0, len(texts), chunk):
                    guide_features = batch_to_device(guide.preprocess(texts[start : start + chunk]), guide.device)
                    vectors.append(guide(guide_features)["sentence_embedding"].float())
            out.append(F.normalize(torch.cat(vectors), dim=-1).to(feature["input_ids"].device))
        return out

    def _context_features(
        self, module: ContextualTransformer, documents: dict[str, Any]
    ) -> tuple[dict[str, Tensor] | None, Tensor | None]:
        """The batch's context: first-stage inputs from the document column (see :func:`batch_context`), and with
        ``leave_one_out`` the (B, J') mask of the slots each pair may read (see :func:`context_visibility`)."""
        if module.context_size == 0:
            return None, None
        if not self._warned_unprompted_context and not _carries_prompt(documents, module):
            logger.warning(
                "The document column carries no prompt, so the training context is built from unprefixed documents, "
                f"while set_context() prefixes {module.document_prompt!r} at inference. Pass "
                "SentenceTransformerTrainingArguments(prompts={'<document column>': ...}) to train with the prefix."
            )
            self._warned_unprompted_context = True
        ids = documents["input_ids"]
        digest = hashlib.blake2b(ids.detach().cpu().numpy().tobytes(), digest_size=8).digest()
        batch_seed = int.from_bytes(digest, "little") ^ self.context_seed
        seed = batch_seed if ids.shape[0] > module.context_size else self.context_seed
        context = batch_context(
            documents,
            module.context_size,
            seed=seed,
            max_length=module.context_max_seq_length,
            end_token_id=module.tokenizer.sep_token_id,
        )
        if self.context_dropout > 0 and module.training:
            self._context_calls += 1
            rng = np.random.default_rng([batch_seed, self._context_calls])
            n = context["input_ids"].shape[0]
            if rng.random() < self.context_dropout:
                keep = int(rng.integers(0, n))  # J' < n real documents; the model fills the rest with null
                context = {k: v[:keep] for k, v in context.items()}
        num_slots = context["input_ids"].shape[0]
        if not self.leave_one_out or num_slots == 0:
            return context, None
        rows = batch_context_rows(ids.shape[0], module.context_size, seed)[:num_slots]
        return context, context_visibility(documents, rows)

    def _embed_context(self, module: ContextualTransformer, features: dict[str, Tensor]) -> Tensor:
        """First stage on a batch's context features; an empty context (context dropout) is (0, d)."""
        if features["input_ids"].shape[0] == 0:
            return module.null_vector.new_zeros(0, module.hidden_size)
        return self._first_stage(module, features)

    def _first_stage(self, module: ContextualTransformer, features: dict[str, Tensor]) -> Tensor:
        """The first stage on (a chunk of) context features, in the model's mixed precision. The loss calls it
        outside the model's forward, which is where accelerate (the trainer's ``bf16`` / ``fp16``) puts its
        autocast: without this the first stage would silently run in float32 while the second ran in bf16."""
        if getattr(self._net, "_original_forward", None) is None:  # not prepared with mixed precision
            return module.embed_context_features(features)
        from accelerate.utils import get_mixed_precision_context_manager

        with get_mixed_precision_context_manager(native_amp=True):
            return module.embed_context_features(features)

    # ------------------------------------------------------------------ embedding (CachedLossMixin hooks)
    def embed_minibatch(
        self,
        sentence_feature: dict[str, Tensor],
        begin: int,
        end: int,
        with_grad: bool,
        copy_random_state: bool,
        random_state: RandContext | None = None,
        dataset_embeddings: Tensor | None = None,
        context_mask: Tensor | None = None,
    ) -> tuple[Tensor, RandContext | None]:
        """Second stage on rows ``begin:end`` of a column, against the (J, d) context ``dataset_embeddings``
        (a keyword, not a feature: the mini-batch slicer would cut a context tensor into row chunks), of which
        row i may read the slots where the column's (B, J) ``context_mask`` is True (None: all)."""
        grad_context = nullcontext if with_grad else torch.no_grad
        random_state_context = nullcontext() if random_state is None else random_state
        minibatch = _create_minibatch(sentence_feature, begin, end)
        kwargs = {} if dataset_embeddings is None else {"dataset_embeddings": dataset_embeddings}
        if context_mask is not None:
            kwargs["context_mask"] = context_mask[begin:end]
        with random_state_context:
            with grad_context():
                random_state = RandContext(*minibatch.values()) if copy_random_state else None
                reps = self._net(minibatch, **kwargs)["sentence_embedding"]  # (mini_batch_size, d)
        return reps, random_state

    def embed_minibatch_iter(
        self,
        sentence_feature: dict[str, Tensor],
        with_grad: bool,
        copy_random_state: bool,
        random_states: list[RandContext] | None = None,
        ranges: list[tuple[int, int]] | None = None,
        dataset_embeddings: Tensor | None = None,
        context_mask: Tensor | None = None,
    ) -> Iterator[tuple[Tensor, RandContext | None]]:
        """Second stage over every mini-batch of a column (the contract of ST's ``_backward_hook``)."""
        if ranges is None:
            ranges = _minibatch_ranges(sentence_feature, self._second_stage_chunk(sentence_feature))
        for i, (begin, end) in enumerate(ranges):
            yield self.embed_minibatch(
                sentence_feature,
                begin,
                end,
                with_grad=with_grad,
                copy_random_state=copy_random_state,
                random_state=None if random_states is None else random_states[i],
                dataset_embeddings=dataset_embeddings,
                context_mask=context_mask,
            )

    def _second_stage_chunk(self, feature: dict[str, Any]) -> int:
        return self.mini_batch_size or _get_batch_size(feature)

    # ------------------------------------------------------------------ the loss
    def calculate_loss(
        self,
        reps: list[list[Tensor]],
        labels: Tensor | None = None,
        *,
        with_backward: bool = False,
        guide_reps: list[Tensor] | None = None,
    ) -> Tensor:
        """Filtered InfoNCE from per-chunk embeddings ``reps[column][chunk]``, chunked over rows of the score
        matrix (``mini_batch_size`` rows at a time). Labels are unused: row i's positive is column i.

        ``guide_reps``: normalised guide embeddings [anchors (B, d_g), positives (B, d_g)], or None (no filtering).
        With ``with_backward`` each chunk is back-propagated to ``reps`` at once and the detached total returned.
        """
        columns = [torch.cat(column) for column in reps]  # (B, d) each: queries, positives, negatives...
        if self.gather_across_devices and torch.is_grad_enabled() and not with_backward:
            raise ValueError("gather_across_devices back-propagates inside calculate_loss: pass with_backward=True.")
        batch_size = columns[0].shape[0]
        guide_q, guide_d = guide_reps if guide_reps is not None else (None, None)
        guide_pos = (guide_q * guide_d).sum(-1) if guide_reps is not None else None  # (B,) f(q_i, d_i)
        local_q = columns[0]  # this rank's queries
        offset, gathered = 0, None
        if self.gather_across_devices and world()[0] > 1:
            # Every rank's embeddings become candidates. Gathered as leaves: each chunk back-propagates into them
            # locally and one collective at the end returns every rank's gradient to the rows' owner.
            gathered = [gather_rows(column) for column in columns]
            offset = gathered[0][1]
            columns = [rows.requires_grad_(column.requires_grad) for (rows, _, _), column in zip(gathered, columns)]
            if guide_reps is not None:
                guide_q, guide_d = gather_rows(guide_q)[0], gather_rows(guide_d)[0]
        queries, positives = columns[0], columns[1]  # (N, d): N = B, or all ranks' rows when gathering
        candidates = torch.cat(columns[1:])  # (N * (1 + n_neg), d)
        num_hard = candidates.shape[0] - positives.shape[0]
        chunk = self.mini_batch_size or batch_size

        total = local_q.new_zeros(())
        for begin in range(0, batch_size, chunk):
            end = min(begin + chunk, batch_size)
            rows = torch.arange(end - begin, device=local_q.device)
            own = rows + begin + offset  # each row's positive column (and its own query/document row)
            q = queries[offset + begin : offset + end]

            scores_qd = cos_sim(q, candidates) * self.scale  # (mb, B * (1 + n_neg))
            positive_logits = scores_qd[rows, own]
            if guide_q is not None:
                removed = false_negative_mask(guide_q[own], guide_d, self.margin, positive_index=own)
                removed = torch.cat([removed, removed.new_zeros(len(rows), num_hard)], dim=1)  # hard negatives stay
                scores_qd = scores_qd.masked_fill(removed, -torch.inf)
            blocks = [scores_qd]

            if self.bidirectional:
                d = positives[offset + begin : offset + end]
                # (rows, candidates, guide rows, guide candidates): q->q, d->q, d->d
                for row_reps, cand_reps, g_rows, g_cands in (
                    (q, queries, guide_q, guide_q),
                    (d, queries, guide_d, guide_q),
                    (d, positives, guide_d, guide_d),
                ):
                    scores = cos_sim(row_reps, cand_reps) * self.scale  # (mb, B)
                    # q_i->q_i and d_i->d_i are self-pairs; d_i->q_i is the positive pair, already counted above.
                    removed = torch.zeros_like(scores, dtype=torch.bool)
                    removed[rows, own] = True
                    if g_rows is not None:
                        removed |= false_negative_mask(
                            g_rows[own], g_cands, self.margin, positive_scores=guide_pos[begin:end]
                        )
                    blocks.append(scores.masked_fill(removed, -torch.inf))

            chunk_loss = (torch.logsumexp(torch.cat(blocks, dim=1), dim=1) - positive_logits).sum() / batch_size
            if with_backward:
                chunk_loss.backward()
                chunk_loss = chunk_loss.detach()
            total = total + chunk_loss
        if gathered is not None and with_backward:
            # d (sum of every rank's loss) / d (this rank's rows), into the per-chunk leaves of ``reps``.
            for column, leaf in zip(reps, columns):
                rows = torch.cat(column)
                grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                local_grad = scatter_gradient(grad, offset, rows.shape[0])  # a collective: every rank calls it
                if rows.requires_grad:
                    torch.autograd.backward(rows, local_grad.to(rows.dtype))
        return total

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        # Shallow copies: the model writes its outputs into the dicts it is given.
        features = [dict(feature) for feature in sentence_features]
        if len(features) < 2:
            raise ValueError(
                f"FilteredInfoNCELoss expects (anchor, positive[, negatives...]) columns, got {len(features)} column(s)."
            )
        if any("cu_seq_lens_q" in feature for feature in features):
            raise ValueError("FilteredInfoNCELoss does not support flattened (unpadded) inputs; use padded batches.")
        module = self._contextual_module()
        # Before any forward: modules may edit the features in place (Pooling(include_prompt=False) masks prompts).
        guide_reps = self._guide_embeddings(features) if self._guide else None
        context_features, context_mask = None, None
        if module is not None:
            context_features, context_mask = self._context_features(module, features[1])
        if self.cached:
            return self._forward_cached(features, labels, module, context_features, context_mask, guide_reps)
        return self._forward_direct(features, labels, module, context_features, context_mask, guide_reps)

    def _forward_direct(
        self,
        features: list[dict[str, Any]],
        labels: Tensor | None,
        module: ContextualTransformer | None,
        context_features: dict[str, Tensor] | None,
        context_mask: Tensor | None,
        guide_reps: list[Tensor] | None,
    ) -> Tensor:
        """No caching: one pass per stage, graphs kept. The loss still back-propagates from a hook (like the cached
        path) so that wrappers decorating :meth:`calculate_loss` (MatryoshkaLoss) work the same in both modes."""
        kwargs = {}
        if context_features is not None:
            kwargs["dataset_embeddings"] = self._embed_context(module, context_features)  # (J', d)
        if context_mask is not None:
            kwargs["context_mask"] = context_mask  # the same rows in every column
        reps = [self._net(feature, **kwargs)["sentence_embedding"] for feature in features]
        if not torch.is_grad_enabled():
            return self.calculate_loss([[r] for r in reps], labels, guide_reps=guide_reps)
        leaves = [[r.detach().requires_grad_()] for r in reps]
        loss = self.calculate_loss(leaves, labels, with_backward=True, guide_reps=guide_reps)
        grads = _cached_gradients(leaves, type(self).__name__)
        loss = loss.detach().requires_grad_()
        loss.register_hook(partial(_direct_backward_hook, loss_obj=self, reps=reps, grads=[g[0] for g in grads]))
        return loss

    def _forward_cached(
        self,
        features: list[dict[str, Any]],
        labels: Tensor | None,
        module: ContextualTransformer | None,
        context_features: dict[str, Tensor] | None,
        context_mask: Tensor | None,
        guide_reps: list[Tensor] | None,
    ) -> Tensor:
        """Two-stage GradCache, see the module docstring."""
        grad_enabled = torch.is_grad_enabled()
        # Boundaries first: modules may modify features in place, and the replay must use the same chunks.
        ranges = [_minibatch_ranges(feature, self._second_stage_chunk(feature)) for feature in features]

        # Step 1a: first stage without grad, chunk by chunk, remembering each chunk's RNG state.
        context, context_ranges, context_states = None, [], []
        if context_features is not None and context_features["input_ids"].shape[0] == 0:
            context = self._embed_context(module, context_features)  # context dropout left no document
        elif context_features is not None:
            context_ranges = _minibatch_ranges(
                context_features, self.context_mini_batch_size or _get_batch_size(context_features)
            )
            chunks = []
            for begin, end in context_ranges:
                minibatch = _create_minibatch(context_features, begin, end)
                context_states.append(RandContext(*minibatch.values()) if grad_enabled else None)
                with torch.no_grad():
                    chunks.append(self._first_stage(module, minibatch))
            context = torch.cat(chunks)  # (J', d)

        # Step 1b: second stage without grad, every column against that context.
        reps, random_states = [], []
        for feature, column_ranges in zip(features, ranges):
            column_reps, column_states = [], []
            for reps_mb, state in self.embed_minibatch_iter(
                feature,
                with_grad=False,
                copy_random_state=grad_enabled,
                ranges=column_ranges,
                dataset_embeddings=context,
                context_mask=context_mask,
            ):
                column_reps.append(reps_mb.detach().requires_grad_())
                column_states.append(state)
            reps.append(column_reps)
            random_states.append(column_states)

        if not grad_enabled:
            return self.calculate_loss(reps, labels, guide_reps=guide_reps)

        # Step 2: loss and its gradient w.r.t. every embedding (the cache).
        loss = self.calculate_loss(reps, labels, with_backward=True, guide_reps=guide_reps)
        cache = _cached_gradients(reps, type(self).__name__)
        loss = loss.detach().requires_grad_()

        # Step 3 runs when the trainer calls loss.backward(): replay M2, then M1.
        loss.register_hook(
            partial(
                _two_stage_backward_hook,
                loss_obj=self,
                features=features,
                cache=cache,
                random_states=random_states,
                ranges=ranges,
                module=module,
                context=context,
                context_mask=context_mask,
                context_features=context_features,
                context_ranges=context_ranges,
                context_states=context_states,
            )
        )
        return loss

    # ------------------------------------------------------------------ sentence-transformers conventions
    def get_config_dict(self) -> dict[str, Any]:
        guide = self.guide
        guide_name = None
        if guide is not None:
            guide_name = getattr(getattr(guide, "model_card_data", None), "base_model", None) or type(guide).__name__
        return {
            "guide": guide_name,
            "temperature": self.temperature,
            "margin": self.margin,
            "mini_batch_size": self.mini_batch_size,
            "context_mini_batch_size": self.context_mini_batch_size,
            "bidirectional": self.bidirectional,
            "filter_false_negatives": self.filter_false_negatives,
            "context_seed": self.context_seed,
            "context_dropout": self.context_dropout,
            "gather_across_devices": self.gather_across_devices,
            "leave_one_out": self.leave_one_out,
        }

    @property
    def citation(self) -> str:
        return """
@inproceedings{morris2025contextual,
    title={Contextual Document Embeddings},
    author={John Xavier Morris and Alexander M. Rush},
    booktitle={The Thirteenth International Conference on Learning Representations},
    year={2025},
    url={https://arxiv.org/abs/2410.02525}
}
"""


def _decode_texts(features: dict[str, Any], tokenizer) -> list[str]:
    """The texts behind a column's tokens, without the prompt (the guide has its own conventions)."""
    ids = features["input_ids"]
    start = 0
    prompt_length = features.get("prompt_length")
    if prompt_length is not None and getattr(tokenizer, "padding_side", "right") == "right":
        # [CLS] + prompt tokens come first; skip_special_tokens drops [SEP]/[PAD] behind the text.
        start = int(prompt_length.flatten()[0]) if isinstance(prompt_length, Tensor) else int(prompt_length)
    return tokenizer.batch_decode(ids[:, start:], skip_special_tokens=True)


def _carries_prompt(documents: dict[str, Any], module: ContextualTransformer) -> bool:
    """Whether the document column starts with the model's document prompt (as a trainer prompt, which records
    ``prompt_length``, or already written into the texts), or the model has no document prompt."""
    if "prompt_length" in documents or not module.document_prompt:
        return True
    prompt_ids = module.tokenizer(module.document_prompt, add_special_tokens=False)["input_ids"]
    first = documents["input_ids"][0].tolist()
    return any(first[i : i + len(prompt_ids)] == prompt_ids for i in (0, 1))  # with or without a leading [CLS]


def _cached_gradients(reps: list[list[Tensor]], loss_name: str) -> list[list[Tensor]]:
    cache = [[rep.grad for rep in column] for column in reps]
    unused = [str(i) for i, column in enumerate(cache) if any(g is None for g in column)]
    if unused:
        raise ValueError(f"The loss of {loss_name} did not use input column(s) {', '.join(unused)}.")
    return cache


def _direct_backward_hook(
    grad_output: Tensor, loss_obj: FilteredInfoNCELoss, reps: list[Tensor], grads: list[Tensor]
) -> None:
    """Uncached path: push the cached embedding gradients through the kept graphs (one backward for all columns,
    so a shared context graph is traversed once), then synchronise the gradients under DDP."""
    pairs = [(r, g * grad_output) for r, g in zip(reps, grads) if r.requires_grad]
    if pairs:
        with torch.enable_grad():
            torch.autograd.backward([r for r, _ in pairs], [g.to(r.dtype) for r, g in pairs])
    loss_obj._synchronize_gradients()


class _ContextReplay:
    """Adapter for ST's ``_backward_hook``: replays the second stage against one fixed context leaf (and mask)."""

    def __init__(self, loss: FilteredInfoNCELoss, context: Tensor | None, context_mask: Tensor | None) -> None:
        self.loss = loss
        self.model = loss._net  # not the DDP wrapper: ST's hook would synchronise before the first stage replays
        self.context = context
        self.context_mask = context_mask

    def embed_minibatch_iter(self, **kwargs) -> Iterator[tuple[Tensor, RandContext | None]]:
        return self.loss.embed_minibatch_iter(**kwargs, dataset_embeddings=self.context, context_mask=self.context_mask)


def _two_stage_backward_hook(
    grad_output: Tensor,
    loss_obj: FilteredInfoNCELoss,
    features: list[dict[str, Any]],
    cache: list[list[Tensor]],
    random_states: list[list[RandContext]],
    ranges: list[list[tuple[int, int]]],
    module: ContextualTransformer | None,
    context: Tensor | None,
    context_mask: Tensor | None,
    context_features: dict[str, Tensor] | None,
    context_ranges: list[tuple[int, int]],
    context_states: list[RandContext],
) -> None:
    """Step 3: replay M2 chunk by chunk (ST's hook; the context leaf accumulates d loss / d context over all
    chunks and columns), then replay M1 chunk by chunk with that gradient."""
    context_leaf = None if context is None else context.detach().requires_grad_()
    _backward_hook(
        grad_output, features, _ContextReplay(loss_obj, context_leaf, context_mask), cache, random_states, ranges
    )
    if context_leaf is not None and context_leaf.grad is not None:
        context_grad = context_leaf.grad  # (J', d), already scaled by grad_output
        with torch.enable_grad():
            for (begin, end), state in zip(context_ranges, context_states):
                minibatch = _create_minibatch(context_features, begin, end)
                with state:
                    vectors = loss_obj._first_stage(module, minibatch)
                if vectors.requires_grad:
                    vectors.backward(context_grad[begin:end].to(vectors.dtype))
    loss_obj._synchronize_gradients()
