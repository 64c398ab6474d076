"""Data-parallel training of the contextual model: gradient averaging and cross-rank gathering.

Why not DistributedDataParallel's own reducer: DDP averages the gradients that reach it during the backward pass
of *its* forward. The contextual loss runs the first stage (the context) and, with gradient caching, every chunk
of both stages outside any single forward, replaying them inside the loss's backward hook; DDP's reducer would
then synchronise only part of the gradients (the defect of the reference code, where under multi-GPU gradient
caching only the first context chunks reach the first stage). :class:`~cde_st.losses.FilteredInfoNCELoss`
therefore runs the model behind the DDP wrapper and, once its backward hook has pushed every cached gradient into
both stages, averages all gradients across the DDP process group in one collective (:func:`average_gradients`).
The trainer's DDP wrapper still broadcasts rank 0's weights at construction and its ``no_sync()`` (gradient
accumulation) is honoured.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel


def ddp_wrapper(model: nn.Module) -> DistributedDataParallel | None:
    """The DistributedDataParallel wrapper of ``model`` (also behind ``torch.compile``), or None."""
    model = getattr(model, "_orig_mod", model)
    return model if isinstance(model, DistributedDataParallel) else None


def unwrap_ddp(model: nn.Module) -> nn.Module:
    """The model behind a DistributedDataParallel wrapper (a compiled wrapper is unwrapped too); else ``model``."""
    ddp = ddp_wrapper(model)
    return model if ddp is None else ddp.module


def world() -> tuple[int, int]:
    """(world size, rank) of the initialised default process group, else (1, 0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def end_process_group() -> None:
    """Destroy the default process group if one is running. A process that exits with gloo's threads still up can
    abort in C++ teardown ("terminate called without an active exception", exit -6) after a successful run; the
    trainer starts the group under torchrun and nothing else ends it."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def average_gradients(ddp: DistributedDataParallel) -> None:
    """Average the gradients of every trainable parameter of ``ddp.module`` over ``ddp``'s process group.

    A parameter whose gradient is None on some ranks and set on others (e.g. the first stage on a rank whose
    context dropout left no document) counts as zero there, as in a single process summing the ranks' losses.
    Parameters with no gradient on any rank keep None. Inside ``ddp.no_sync()`` (the non-final micro-batches of
    gradient accumulation) nothing is exchanged: the accumulated gradients are averaged on the final one, which
    gives the same result since averaging is linear.
    """
    if not ddp.require_backward_grad_sync:
        return
    group = ddp.process_group
    world_size = dist.get_world_size(group)
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    if world_size == 1 or not params:
        return
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(present, op=dist.ReduceOp.MAX, group=group)
    buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
    for param, anywhere in zip(params, present.tolist()):
        if not anywhere:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        buckets[(param.grad.device, param.grad.dtype)].append(param.grad)
    for key in sorted(buckets, key=str):  # the same order on every rank
        grads = buckets[key]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat /= world_size
        for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(averaged)


def gather_rows(tensor: Tensor) -> tuple[Tensor, int, list[int]]:
    """All ranks' rows of ``tensor`` (n_r, ...) in rank order, without gradient: (sum_r n_r, ...), the offset of
    this rank's rows and every rank's row count. Ranks may hold different numbers of rows (a last, smaller batch)."""
    world_size, rank = world()
    if world_size == 1:
        return tensor.detach(), 0, [tensor.shape[0]]
    size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    padded = F.pad(tensor.detach(), (0, 0) * (tensor.ndim - 1) + (0, max(counts) - tensor.shape[0]))
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, counts)]), sum(counts[:rank]), counts


def scatter_gradient(gathered_grad: Tensor, offset: int, count: int) -> Tensor:
    """This rank's rows of the gradient of a gathered tensor, summed over every rank's loss: the backward of
    :func:`gather_rows` (one collective, however many chunks the loss was computed in)."""
    if world()[0] > 1:
        gathered_grad = gathered_grad.contiguous()
        dist.all_reduce(gathered_grad)
    return gathered_grad[offset : offset + count]
