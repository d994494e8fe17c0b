"""The losses that gather over processes, under 2 gloo processes: each rank holds half of a
global batch; the mean of the ranks' losses is the reference formula on the whole batch, and each
rank's gradient (what DDP averages) is the whole batch's gradient of its own rows. DINO's centre
is the whole batch's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from helpers import free_port
from reference import reference_barlowtwins, reference_mocov3, reference_nt_xent

N, D, WORLD = 6, 5, 2  # rows per rank, embedding size


def _batch():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N * WORLD, D, generator=g) for _ in range(2)]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from e2mc.methods import barlowtwins_loss, mocov3_loss, nt_xent_loss
    from e2mc.methods.dino import updated_center

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        rows = slice(rank * N, (rank + 1) * N)
        results = {}
        losses = {"simclr": lambda a, b: nt_xent_loss(a, b, 0.5),
                  "barlowtwins": lambda a, b: barlowtwins_loss(
                      a, b, nn.BatchNorm1d(D, affine=False), 0.1)[0],
                  "mocov3": lambda a, b: mocov3_loss(a, b, 0.2)}
        for name, fn in losses.items():
            a, b = (x[rows].clone().requires_grad_() for x in _batch())
            loss = fn(a, b)
            loss.backward()
            results[name] = (loss.detach(), a.grad, b.grad)
        teacher_out = _batch()[0][rows]
        results["center"] = updated_center(torch.zeros(1, D), teacher_out, 0.9)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes: a few seconds on 2 cores
def test_gathered_losses_equal_the_reference_on_the_global_batch(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    refs = {"simclr": lambda a, b: reference_nt_xent(a, b, 0.5),
            "barlowtwins": lambda a, b: reference_barlowtwins(a, b, 0.1),
            "mocov3": lambda a, b: reference_mocov3(a, b, 0.2)}
    for name, ref in refs.items():
        a, b = (x.clone().requires_grad_() for x in _batch())
        value = ref(a, b)
        value.backward()
        local = torch.stack([r[name][0] for r in ranks])
        if name == "barlowtwins":  # every rank computes the global batch's loss
            torch.testing.assert_close(local, value.detach().expand(WORLD), rtol=1e-5, atol=1e-6)
        else:  # each rank its own anchors' mean; the global mean is their mean
            torch.testing.assert_close(local.mean(), value.detach(), rtol=1e-5, atol=1e-6)
        for r, res in enumerate(ranks):
            rows = slice(r * N, (r + 1) * N)
            # DDP divides the summed gradients by the world size
            torch.testing.assert_close(res[name][1] / WORLD, a.grad[rows], rtol=1e-4,
                                       atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
            if name != "mocov3":  # MoCo v3's keys carry no gradient
                torch.testing.assert_close(res[name][2] / WORLD, b.grad[rows], rtol=1e-4,
                                           atol=1e-6)
    whole = 0.1 * _batch()[0].mean(dim=0, keepdim=True)
    for res in ranks:
        torch.testing.assert_close(res["center"], whole)
