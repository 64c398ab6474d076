"""Two-stage gradient caching: how a contextual loss runs both stages of the model, with or without caching.

GradCache (Gao et al. 2021, https://arxiv.org/abs/2101.06983) bounds a contrastive loss's memory by the chunk size
instead of the batch size. sentence-transformers implements it for one model pass per column
(:class:`~sentence_transformers.base.losses.CachedLossMixin`); a contextual model has two stages, the first
(context documents -> context vectors (J, d)) feeding every second-stage pass (text + context vectors -> (B, d)).
:class:`TwoStageCachedLossMixin` extends the three GradCache steps to that shape:

    1. no grad, chunk by chunk: first stage over the context documents -> ``context_vectors`` (J, d);
       second stage over every column with those vectors -> embeddings (B, d) per column
    2. the loss over all embeddings, back-propagated to the embeddings only (cached gradients)
    3. in the backward pass: replay the second stage chunk by chunk with grad, pushing the cached gradients into
       M2's weights and into a leaf copy of the context vectors, whose gradient accumulates over all chunks and
       columns; then replay the first stage chunk by chunk and push that gradient into M1's weights.

Each replay restores the RNG state of its first pass (``RandContext``), so dropout and sequence dropout draw the
same masks and the gradients are those of the embeddings the loss saw. Without caching (no chunk size set) both
stages run once with their graphs kept, and the loss still back-propagates from a hook on the returned loss, so
that wrappers such as MatryoshkaLoss see the same behaviour in both modes.

Both stages run outside DistributedDataParallel's forward (the first stage has no place in it), so the gradients
are averaged across ranks once both stages have received theirs (:mod:`cde_st.distributed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from accelerate.utils import get_mixed_precision_context_manager
from sentence_transformers.base.losses import CachedLossMixin, RandContext

# Private helpers of sentence-transformers' GradCache machinery (pinned by the project's `<7` bound): the
# mini-batch slicer (trims padding per chunk), the range splitter and the backward hook that replays a column.
from sentence_transformers.base.losses.gradcache import (
    _backward_hook,
    _create_minibatch,
    _get_batch_size,
    _minibatch_ranges,
)
from torch import Tensor, nn

from cde_st.distributed import average_gradients, ddp_wrapper, unwrap_ddp
from cde_st.modules import ContextualTransformer


class TwoStageCachedLossMixin(CachedLossMixin):
    """Runs a (contextual or plain) model for a loss: both stages, with two-stage gradient caching when a chunk
    size is set (see the module docstring).

    A subclass is an ``nn.Module`` holding ``model``, ``mini_batch_size`` (second-stage chunk) and
    ``context_mini_batch_size`` (first-stage chunk), and implements ``calculate_loss(reps, labels, *,
    with_backward, **loss_kwargs)`` over per-chunk embeddings ``reps[column][chunk]``, as sentence-transformers'
    cached losses do. Its ``forward`` prepares the batch's context and calls :meth:`forward_two_stage`.
    """

    model: nn.Module
    mini_batch_size: int | None
    context_mini_batch_size: int | None

    @property
    def cached(self) -> bool:
        """Whether gradient caching (chunked no-grad passes + replay) is on."""
        return self.mini_batch_size is not None or self.context_mini_batch_size is not None

    @property
    def _net(self) -> nn.Module:
        """The model the loss runs: ``self.model`` behind a DistributedDataParallel wrapper, if any. Both stages
        run outside DDP's forward and :func:`cde_st.distributed.average_gradients` synchronises them after the
        backward hook (see :mod:`cde_st.distributed`)."""
        return unwrap_ddp(self.model)

    def _synchronize_gradients(self) -> None:
        """Under DDP, average every gradient across ranks once both stages have received theirs."""
        ddp = ddp_wrapper(self.model)
        if ddp is not None:
            average_gradients(ddp)

    # ------------------------------------------------------------------ the two forward paths
    def forward_two_stage(
        self,
        features: list[dict[str, Any]],
        labels: Tensor | None,
        module: ContextualTransformer | None,
        context_features: dict[str, Tensor] | None,
        context_mask: Tensor | None,
        **loss_kwargs: Any,
    ) -> Tensor:
        """The loss of a batch: first stage on ``context_features`` (None: a plain model, or no context slots),
        second stage on every column against the resulting context vectors, of which row i may read the slots
        where the (B, J') ``context_mask`` is True (None: all), then ``calculate_loss(reps, labels, **loss_kwargs)``.
        Returns a loss whose backward pushes the gradients into both stages (and synchronises them under DDP)."""
        forward = self._forward_cached if self.cached else self._forward_direct
        return forward(features, labels, module, context_features, context_mask, **loss_kwargs)

    def _forward_direct(
        self,
        features: list[dict[str, Any]],
        labels: Tensor | None,
        module: ContextualTransformer | None,
        context_features: dict[str, Tensor] | None,
        context_mask: Tensor | None,
        **loss_kwargs: Any,
    ) -> Tensor:
        """No caching: one pass per stage, graphs kept. The loss still back-propagates from a hook (like the cached
        path) so that wrappers decorating :meth:`calculate_loss` (MatryoshkaLoss) work the same in both modes."""
        kwargs = {}
        if context_features is not None:
            kwargs["context_vectors"] = self._embed_context(module, context_features)  # (J', d)
        if context_mask is not None:
            kwargs["context_mask"] = context_mask  # the same rows in every column
        reps = [self._net(feature, **kwargs)["sentence_embedding"] for feature in features]
        if not torch.is_grad_enabled():
            return self.calculate_loss([[r] for r in reps], labels, **loss_kwargs)
        leaves = [[r.detach().requires_grad_()] for r in reps]
        loss = self.calculate_loss(leaves, labels, with_backward=True, **loss_kwargs)
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
        **loss_kwargs: Any,
    ) -> Tensor:
        """Two-stage GradCache, see the module docstring."""
        grad_enabled = torch.is_grad_enabled()
        # Boundaries first: modules may modify features in place, and the replay must use the same chunks.
        ranges = [_minibatch_ranges(feature, self._second_stage_chunk(feature)) for feature in features]

        # Step 1a: first stage without grad, chunk by chunk, remembering each chunk's RNG state.
        context_vectors, context_ranges, context_states = self._first_stage_chunks(module, context_features)

        # Step 1b: second stage without grad, every column against those context vectors.
        reps, random_states = [], []
        for feature, column_ranges in zip(features, ranges):
            column_reps, column_states = [], []
            for reps_mb, state in self.embed_minibatch_iter(
                feature,
                with_grad=False,
                copy_random_state=grad_enabled,
                ranges=column_ranges,
                context_vectors=context_vectors,
                context_mask=context_mask,
            ):
                column_reps.append(reps_mb.detach().requires_grad_())
                column_states.append(state)
            reps.append(column_reps)
            random_states.append(column_states)

        if not grad_enabled:
            return self.calculate_loss(reps, labels, **loss_kwargs)

        # Step 2: loss and its gradient w.r.t. every embedding (the cache).
        loss = self.calculate_loss(reps, labels, with_backward=True, **loss_kwargs)
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
                context_vectors=context_vectors,
                context_mask=context_mask,
                context_features=context_features,
                context_ranges=context_ranges,
                context_states=context_states,
            )
        )
        return loss

    # ------------------------------------------------------------------ first stage
    def _first_stage_chunks(
        self, module: ContextualTransformer | None, context_features: dict[str, Tensor] | None
    ) -> tuple[Tensor | None, list[tuple[int, int]], list[RandContext | None]]:
        """Step 1a of :meth:`_forward_cached`: the (J', d) context vectors, computed without grad chunk by chunk;
        the chunks' row ranges and RNG states (None without grad), for the replay. No context: (None, [], [])."""
        if context_features is None:
            return None, [], []
        if context_features["input_ids"].shape[0] == 0:  # context dropout left no document
            return self._embed_context(module, context_features), [], []
        context_ranges = _minibatch_ranges(
            context_features, self.context_mini_batch_size or _get_batch_size(context_features)
        )
        chunks, context_states = [], []
        for begin, end in context_ranges:
            minibatch = _create_minibatch(context_features, begin, end)
            context_states.append(RandContext(*minibatch.values()) if torch.is_grad_enabled() else None)
            with torch.no_grad():
                chunks.append(self._first_stage(module, minibatch))
        return torch.cat(chunks), context_ranges, context_states  # (J', d)

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
        with get_mixed_precision_context_manager(native_amp=True):
            return module.embed_context_features(features)

    # ------------------------------------------------------------------ second stage (CachedLossMixin hooks)
    def embed_minibatch(
        self,
        sentence_feature: dict[str, Tensor],
        begin: int,
        end: int,
        with_grad: bool,
        copy_random_state: bool,
        random_state: RandContext | None = None,
        context_vectors: Tensor | None = None,
        context_mask: Tensor | None = None,
    ) -> tuple[Tensor, RandContext | None]:
        """Second stage on rows ``begin:end`` of a column, against the (J, d) ``context_vectors`` (a keyword, not a
        feature: the mini-batch slicer would cut them into row chunks), of which row i may read the slots where
        the column's (B, J) ``context_mask`` is True (None: all)."""
        grad_context = nullcontext if with_grad else torch.no_grad
        random_state_context = nullcontext() if random_state is None else random_state
        minibatch = _create_minibatch(sentence_feature, begin, end)
        kwargs = {} if context_vectors is None else {"context_vectors": context_vectors}
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
        context_vectors: Tensor | None = None,
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
                context_vectors=context_vectors,
                context_mask=context_mask,
            )

    def _second_stage_chunk(self, feature: dict[str, Any]) -> int:
        return self.mini_batch_size or _get_batch_size(feature)


def _cached_gradients(reps: list[list[Tensor]], loss_name: str) -> list[list[Tensor]]:
    """The gradients step 2 left on the per-chunk embedding leaves; an error names a column the loss never read."""
    cache = [[rep.grad for rep in column] for column in reps]
    unused = [str(i) for i, column in enumerate(cache) if any(g is None for g in column)]
    if unused:
        raise ValueError(f"The loss of {loss_name} did not use input column(s) {', '.join(unused)}.")
    return cache


def _direct_backward_hook(
    grad_output: Tensor, loss_obj: TwoStageCachedLossMixin, reps: list[Tensor], grads: list[Tensor]
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

    def __init__(
        self, loss: TwoStageCachedLossMixin, context_vectors: Tensor | None, context_mask: Tensor | None
    ) -> None:
        self.loss = loss
        self.model = loss._net  # not the DDP wrapper: ST's hook would synchronise before the first stage replays
        self.context_vectors = context_vectors
        self.context_mask = context_mask

    def embed_minibatch_iter(self, **kwargs: Any) -> Iterator[tuple[Tensor, RandContext | None]]:
        return self.loss.embed_minibatch_iter(
            **kwargs, context_vectors=self.context_vectors, context_mask=self.context_mask
        )


def _two_stage_backward_hook(
    grad_output: Tensor,
    loss_obj: TwoStageCachedLossMixin,
    features: list[dict[str, Any]],
    cache: list[list[Tensor]],
    random_states: list[list[RandContext]],
    ranges: list[list[tuple[int, int]]],
    module: ContextualTransformer | None,
    context_vectors: Tensor | None,
    context_mask: Tensor | None,
    context_features: dict[str, Tensor] | None,
    context_ranges: list[tuple[int, int]],
    context_states: list[RandContext],
) -> None:
    """Step 3: replay M2 chunk by chunk (ST's hook; the context leaf accumulates d loss / d context_vectors over
    all chunks and columns), then replay M1 chunk by chunk with that gradient."""
    context_leaf = None if context_vectors is None else context_vectors.detach().requires_grad_()
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
