"""Rank helpers and gathering with gradients for ``torch.distributed`` (torchrun, gloo or nccl)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """True inside an initialized process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    return rank() == 0


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every rank along dim 0, in rank order, keeping the autograd graph.

    Gradients flowing into the gathered tensor are summed across ranks and each rank receives the
    gradient of its own rows (``torch.distributed.nn.functional.all_gather``). Outside a
    process group this returns ``x`` unchanged. All ranks must hold the same number of rows.
    Uses the functional collective ``all_gather_single_autograd`` where this torch has it, and
    ``torch.distributed.nn.functional.all_gather`` (deprecated since torch 2.15) otherwise.
    """
    if not is_distributed():
        return x
    import torch.distributed._functional_collectives as collectives

    if hasattr(collectives, "all_gather_single_autograd"):
        gathered = collectives.all_gather_single_autograd(x.contiguous(), 0, dist.group.WORLD)
        return collectives.wait_tensor(gathered)
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()), dim=0)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks without gradient (e.g. Sinkhorn-Knopp marginals); returns ``x``."""
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x
