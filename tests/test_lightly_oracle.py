"""The new methods' losses against lightly's (the issue's oracle), in value and gradient on
random inputs, in one process (under 2 gloo processes: ``test_methods_ddp.py``).

lightly has Barlow Twins, NT-Xent (SimCLR), BYOL's negative cosine similarity, DINO's loss and
LeJEPA's SIGReg (the ``sigreg`` add-on);
it has no MoCo v3 loss (its NT-Xent also scores a query against the other queries, MoCo v3 does
not), so MoCo v3 is checked against the official ``contrastive_loss`` written out in
``tests/reference.py`` (``test_methods_ssl.py``, ``test_methods_ddp.py``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from e2mc.methods import barlowtwins_loss, byol_loss, dino_loss, nt_xent_loss
from e2mc.methods.dino import teacher_temperature, updated_center

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


@pytest.mark.parametrize("n_views, knots, t_max, weight", [(2, 17, 3.0, 1.0), (3, 9, 2.0, 0.05)])
def test_sigreg_equals_lightly_for_the_same_directions(n_views, knots, t_max, weight):
    """Our add-on on a list of views is lightly's ``SIGReg`` on the stacked ``(V, n, d)`` views
    (the mean over views and slices), times ``weight``; both get the same unit directions."""
    from e2mc.addons import SIGReg

    zs = _inputs(*[(32, 8)] * n_views, seed=n_views)
    ours_fn = SIGReg(weight=weight, num_slices=64, knots=knots, t_max=t_max)
    directions = ours_fn.directions(8, torch.device("cpu"), torch.float32)
    ours_fn.directions = lambda dim, device, dtype: directions
    theirs_fn = lightly_loss.SIGReg(knots=knots, t_max=t_max, num_vectors=64)
    theirs_fn._generate_unit_vectors = lambda device, dtype, num_features: directions
    out = ours_fn(zs)
    theirs = theirs_fn(torch.stack(zs))
    torch.testing.assert_close(out["sigreg"], theirs.detach(), rtol=1e-5, atol=1e-5)
    _same_value_and_grad(out["loss"], weight * theirs, zs)
