"""Process setup (:class:`Runtime`, :func:`init_runtime`), rank helpers and gathering (with
gradients, or of any object) for ``torch.distributed`` (torchrun or srun, gloo or nccl)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Runtime:
    """Where this process runs: device, rank, number of processes."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[007-009,12],cpu1`` -> ``gpu007``."""
    first = nodelist.split(",", 1)[0]
    if "[" not in first:
        return first
    prefix, ranges = nodelist.split("[", 1)
    return prefix + re.split(r"[-,\]]", ranges, maxsplit=1)[0]


def srun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``torchrun`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``) derived from SLURM's for a task of a multi-task ``srun`` step; empty
    outside one (or when ``WORLD_SIZE`` is already set)."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS")
    if "WORLD_SIZE" in environ or tasks is None or int(tasks) < 2 \
            or "SLURM_PROCID" not in environ:
        return {}
    job = int(environ.get("SLURM_JOB_ID", "0"))
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": tasks,
            "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
            "MASTER_ADDR": _first_host(nodes) if nodes else "127.0.0.1",
            "MASTER_PORT": environ.get("MASTER_PORT", str(20000 + job % 40000))}


def init_runtime(device: str = "auto") -> Runtime:
    """Pick the device and, under torchrun or a multi-task srun step, join the process group
    (``nccl`` on CUDA, ``gloo`` on CPU)."""
    os.environ.update(srun_environment(os.environ))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("training.device is cuda but no CUDA device is available")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return Runtime(device=dev, rank=rank, world_size=world_size, local_rank=local_rank)


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every process in rank order (through ``torch.save``: tensors in
    ``all_gather_object`` payloads fail to unpickle), read back weights-only."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, buffer.getvalue())
    return [torch.load(io.BytesIO(b), weights_only=True) for b in gathered]


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
    """Concatenate ``x`` from every rank along dim 0, in rank order, keeping the autograd graph
    (each rank gets the summed gradient of its own rows); ``x`` outside a process group. All ranks
    must hold the same number of rows."""
    if not is_distributed():
        return x
    import torch.distributed._functional_collectives as collectives

    if hasattr(collectives, "all_gather_single_autograd"):
        gathered = collectives.all_gather_single_autograd(x.contiguous(), 0, dist.group.WORLD)
        return collectives.wait_tensor(gathered)
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()), dim=0)


def broadcast_from_main(x: torch.Tensor) -> torch.Tensor:
    """Overwrite ``x`` in place with rank 0's (no gradient), e.g. random directions every rank
    must share; returns ``x``. Outside a process group ``x`` is returned unchanged."""
    if is_distributed():
        dist.broadcast(x, src=0)
    return x


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks without gradient (e.g. Sinkhorn-Knopp marginals); returns ``x``."""
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x
