"""The new methods' losses against lightly's (the issue's oracle), in value and gradient on
random inputs, single process and under 2 gloo processes where the loss gathers.

lightly has Barlow Twins, NT-Xent (SimCLR), BYOL's negative cosine similarity and DINO's loss;
it has no MoCo v3 loss (its NT-Xent also scores a query against the other queries, MoCo v3 does
not), so MoCo v3 is checked against the official ``contrastive_loss`` written out in
``tests/reference.py`` (``test_methods_ssl.py``, ``test_methods_ddp.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from e2mc.methods import barlowtwins_loss, byol_loss, dino_loss, nt_xent_loss
from e2mc.methods.dino import teacher_temperature, updated_center
from helpers import free_port

lightly_loss = pytest.importorskip("lightly.loss", reason="lightly (the [dev] extra) is absent")


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _same_value_and_grad(ours, theirs, inputs):
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(ours, inputs), torch.autograd.grad(theirs, inputs),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lambd", [0.0051, 0.3])
def test_barlowtwins_equals_lightly(lambd):
    z1, z2 = _inputs((16, 8), (16, 8))
    ours = barlowtwins_loss(z1, z2, nn.BatchNorm1d(8, affine=False), lambd)[0]
    theirs = lightly_loss.BarlowTwinsLoss(lambda_param=lambd)(z1, z2)
    _same_value_and_grad(ours, theirs, [z1, z2])


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_nt_xent_equals_lightly(temperature):
    z1, z2 = _inputs((10, 6), (10, 6))
    theirs = lightly_loss.NTXentLoss(temperature=temperature)(z1, z2)
    _same_value_and_grad(nt_xent_loss(z1, z2, temperature), theirs, [z1, z2])


def test_byol_equals_lightly_negative_cosine_similarity():
    """BYOL's ``2 - 2 cos`` per direction is ``2 + 2 * NegativeCosineSimilarity``; the target
    carries no gradient in either."""
    p1, p2, t1, t2 = _inputs((6, 4), (6, 4), (6, 4), (6, 4))
    ncs = lightly_loss.NegativeCosineSimilarity()
    theirs = 4 + 2 * (ncs(p1, t2.detach()) + ncs(p2, t1.detach()))
    ours = byol_loss(p1, p2, t1, t2)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    g_ours = torch.autograd.grad(ours, [p1, p2, t1, t2], allow_unused=True)
    g_theirs = torch.autograd.grad(theirs, [p1, p2], allow_unused=True)
    for a, b in zip(g_ours[:2], g_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert all(g is None or torch.count_nonzero(g) == 0 for g in g_ours[2:])


@pytest.mark.parametrize("n_crops", [2, 4])
def test_dino_loss_and_centre_equal_lightly(n_crops):
    batch, k = 5, 12
    student, teacher, center = _inputs((n_crops * batch, k), (2 * batch, k), (1, k))
    center = center.detach()
    theirs_fn = lightly_loss.DINOLoss(output_dim=k, warmup_teacher_temp=0.04, teacher_temp=0.04,
                                      student_temp=0.1, center_momentum=0.9)
    theirs_fn.center.copy_(center.view(1, 1, k))
    theirs = theirs_fn(teacher_out=list(teacher.detach().chunk(2)),
                       student_out=list(student.chunk(n_crops)), teacher_temp=0.04)
    ours = dino_loss(student, teacher, center, n_crops, 0.1, 0.04)
    _same_value_and_grad(ours, theirs, [student])
    torch.testing.assert_close(updated_center(center, teacher.detach(), 0.9),
                               theirs_fn.center.view(1, k))


def test_dino_teacher_temperature_schedule_equals_lightly():
    fn = lightly_loss.DINOLoss(output_dim=4, warmup_teacher_temp=0.04, teacher_temp=0.07,
                               warmup_teacher_temp_epochs=30)
    for epoch in range(40):
        lightly_temp = (float(fn.teacher_temp_schedule[epoch]) if epoch < 30 else fn.teacher_temp)
        assert teacher_temperature(epoch, 0.07, 0.04, 30) == pytest.approx(lightly_temp, rel=1e-6)


# ---- 2 gloo processes -----------------------------------------------------------------------
N, D, WORLD = 6, 5, 2


def _global_batch():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(N * WORLD, D, generator=g) for _ in range(2)]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        rows = slice(rank * N, (rank + 1) * N)
        results = {}
        for who in ("ours", "lightly"):
            a, b = (x[rows].clone().requires_grad_() for x in _global_batch())
            if who == "ours":
                loss = nt_xent_loss(a, b, 0.2)
            else:
                loss = lightly_loss.NTXentLoss(temperature=0.2, gather_distributed=True)(a, b)
            loss.backward()
            results[who] = (loss.detach(), a.grad, b.grad)
        a, b = (x[rows].clone().requires_grad_() for x in _global_batch())
        loss = barlowtwins_loss(a, b, nn.BatchNorm1d(D, affine=False), 0.1)[0]
        loss.backward()
        results["barlowtwins"] = (loss.detach(), a.grad, b.grad)
        teacher = _global_batch()[0][rows]
        fn = lightly_loss.DINOLoss(output_dim=D, center_momentum=0.9)
        fn.update_center(teacher.unsqueeze(0))  # lightly's centre: the mean over all ranks
        results["centre"] = (updated_center(torch.zeros(1, D), teacher, 0.9),
                             fn.center.view(1, D).clone())
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes: a few seconds on 2 cores
def test_gathered_losses_and_dino_centre_equal_lightly_under_two_processes(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for ours, theirs in zip(res["ours"], res["lightly"], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(*res["centre"])
    # The gathered losses are lightly's single-process loss of the whole batch: NT-Xent's mean
    # over the ranks, Barlow Twins' on every rank (e2mc normalises over the global batch, as the
    # official SyncBatchNorm; lightly's gather_distributed averages per-rank matrices of per-rank
    # normalisation, another estimator, so its single-process loss is the oracle); each rank's
    # gradient, divided by the world size as DDP does, is the whole batch's on its rows.
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    oracles = {"ours": lightly_loss.NTXentLoss(temperature=0.2),
               "barlowtwins": lightly_loss.BarlowTwinsLoss(lambda_param=0.1)}
    for name, oracle in oracles.items():
        a, b = (x.clone().requires_grad_() for x in _global_batch())
        whole = oracle(a, b)
        whole.backward()
        values = torch.stack([r[name][0] for r in ranks])
        expected = whole.detach() if name == "ours" else whole.detach().expand(WORLD)
        torch.testing.assert_close(values.mean() if name == "ours" else values, expected,
                                   rtol=1e-5, atol=1e-6)
        for r, res in enumerate(ranks):
            rows = slice(r * N, (r + 1) * N)
            torch.testing.assert_close(res[name][1] / WORLD, a.grad[rows], rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(res[name][2] / WORLD, b.grad[rows], rtol=1e-4, atol=1e-6)

