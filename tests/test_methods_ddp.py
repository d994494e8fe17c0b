"""The losses that gather over processes, under 2 gloo processes: each rank holds half of a
global batch; the mean of the ranks' losses is the reference formula on the whole batch, and each
rank's gradient (what DDP averages) is the whole batch's gradient of its own rows. DINO's centre
is the whole batch's. The same ranks against lightly (the issue's oracle, where it has the loss):
its gathered NT-Xent on each rank, its single-process losses of the whole batch, its centre."""

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
        try:
            import lightly.loss as lightly_loss
        except ImportError:  # lightly (the [dev] extra) absent: the reference formulas only
            lightly_loss = None
        if lightly_loss is not None:
            a, b = (x[rows].clone().requires_grad_() for x in _batch())
            loss = lightly_loss.NTXentLoss(temperature=0.5, gather_distributed=True)(a, b)
            loss.backward()
            results["lightly_simclr"] = (loss.detach(), a.grad, b.grad)
            fn = lightly_loss.DINOLoss(output_dim=D, center_momentum=0.9)
            fn.update_center(teacher_out.unsqueeze(0))  # averaged over the ranks
            results["lightly_center"] = fn.center.view(1, D).clone()
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Each rank's losses, gradients and centre (one spawn for the tests of this file)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def _same_as_whole_batch(ranks: list[dict], name: str, oracle, every_rank: bool,
                         key_gradient: bool = True) -> None:
    """The ranks' ``name`` against ``oracle`` on the whole batch: the value on every rank
    (``every_rank``) or the ranks' mean, and each rank's gradient divided by the world size (as
    DDP averages) equal to the whole batch's on its rows."""
    a, b = (x.clone().requires_grad_() for x in _batch())
    value = oracle(a, b)
    value.backward()
    local = torch.stack([r[name][0] for r in ranks])
    if every_rank:
        torch.testing.assert_close(local, value.detach().expand(WORLD), rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(local.mean(), value.detach(), rtol=1e-5, atol=1e-6)
    for r, res in enumerate(ranks):
        rows = slice(r * N, (r + 1) * N)
        torch.testing.assert_close(res[name][1] / WORLD, a.grad[rows], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
        if key_gradient:
            torch.testing.assert_close(res[name][2] / WORLD, b.grad[rows], rtol=1e-4,
                                       atol=1e-6)


@pytest.mark.slow  # two processes: a few seconds on 2 cores
def test_gathered_losses_equal_lightly_on_the_global_batch(ranks: list[dict]) -> None:
    """e2mc's gathered NT-Xent equals lightly's ``NTXentLoss(gather_distributed=True)`` rank by
    rank, and the ranks equal lightly's single-process losses of the whole batch; Barlow Twins
    against lightly's single-process loss (e2mc normalises over the global batch as the
    official SyncBatchNorm does; lightly's ``gather_distributed`` averages per-rank matrices of
    per-rank normalisation, another estimator); DINO's centre equals lightly's."""
    lightly_loss = pytest.importorskip("lightly.loss", reason="lightly (the [dev] extra) absent")
    for res in ranks:
        for ours, theirs in zip(res["simclr"], res["lightly_simclr"], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(res["center"], res["lightly_center"])
    _same_as_whole_batch(ranks, "simclr", lightly_loss.NTXentLoss(temperature=0.5), False)
    _same_as_whole_batch(ranks, "barlowtwins", lightly_loss.BarlowTwinsLoss(lambda_param=0.1),
                         True)


@pytest.mark.slow  # two processes: a few seconds on 2 cores
def test_gathered_losses_equal_the_reference_on_the_global_batch(ranks: list[dict]) -> None:
    refs = {"simclr": lambda a, b: reference_nt_xent(a, b, 0.5),
            "barlowtwins": lambda a, b: reference_barlowtwins(a, b, 0.1),
            "mocov3": lambda a, b: reference_mocov3(a, b, 0.2)}
    for name, ref in refs.items():  # MoCo v3's keys carry no gradient
        _same_as_whole_batch(ranks, name, ref, name == "barlowtwins", name != "mocov3")
    whole = 0.1 * _batch()[0].mean(dim=0, keepdim=True)
    for res in ranks:
        torch.testing.assert_close(res["center"], whole)
