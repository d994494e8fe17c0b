"""Barlow Twins, SimCLR, BYOL, MoCo v3 and DINO: each loss against a reference written from its
paper (value and gradient), the EMA teachers (frozen, excluded from the optimizer, updated by the
formula after a step, copied from the student when none was loaded), DINO's schedule, centre and
frozen prototype layer, and every method rebuilt from its checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from e2mc.methods import (
    METHODS,
    barlowtwins_loss,
    build_method,
    byol_loss,
    dino_loss,
    mocov3_loss,
    nt_xent_loss,
)
from e2mc.methods.dino import teacher_temperature, updated_center
from reference import (
    reference_barlowtwins,
    reference_byol,
    reference_dino,
    reference_mocov3,
    reference_nt_xent,
)

NEW = ("barlowtwins", "simclr", "byol", "mocov3", "dino")
SMALL = {"barlowtwins": {"projector": "32-32"}, "simclr": {"hidden_dim": 32, "dim": 16},
         "byol": {"hidden_dim": 32, "dim": 16}, "mocov3": {"dim": 16, "mlp_dim": 32},
         "dino": {"out_dim": 40, "hidden_dim": 32, "bottleneck_dim": 16}}


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def _same_value_and_grad(ours, ref, inputs):
    torch.testing.assert_close(ours.double(), ref.double(), rtol=1e-5, atol=1e-6)
    g_ours = torch.autograd.grad(ours, inputs, allow_unused=True)
    g_ref = torch.autograd.grad(ref, inputs, allow_unused=True)
    for a, b in zip(g_ours, g_ref, strict=True):
        if b is None:
            assert a is None or torch.count_nonzero(a) == 0
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-6)


# ---- the losses -----------------------------------------------------------------------------
def test_barlowtwins_loss_matches_the_paper():
    z1, z2 = _inputs((12, 6), (12, 6))
    bn = nn.BatchNorm1d(6, affine=False)
    ours, terms = barlowtwins_loss(z1, z2, bn, lambd=0.3)  # (computed in float32)
    ref = reference_barlowtwins(z1.float(), z2.float(), lambd=0.3)
    _same_value_and_grad(ours, ref, [z1, z2])
    assert set(terms) == {"on_diagonal", "off_diagonal"} and terms["on_diagonal"] > 0
    same, same_terms = barlowtwins_loss(z1.detach(), z1.detach(), bn)  # diag(C) = 1
    assert float(same_terms["on_diagonal"]) < 1e-6 and same.item() > 0  # redundancy remains


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_nt_xent_matches_the_paper(temperature):
    z1, z2 = _inputs((7, 5), (7, 5))
    ours = nt_xent_loss(z1, z2, temperature)
    _same_value_and_grad(ours, reference_nt_xent(z1.float(), z2.float(), temperature), [z1, z2])


def test_byol_loss_matches_the_paper_and_stops_the_target_gradient():
    p1, p2, t1, t2 = _inputs((6, 4), (6, 4), (6, 4), (6, 4))
    ours = byol_loss(p1, p2, t1, t2)
    _same_value_and_grad(ours, reference_byol(p1.float(), p2.float(), t1.float(), t2.float()),
                         [p1, p2, t1, t2])
    assert byol_loss(t2, t1, t1, t2).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_mocov3_loss_matches_the_paper(temperature):
    q, k = _inputs((9, 5), (9, 5))
    ours = mocov3_loss(q, k, temperature)
    _same_value_and_grad(ours, reference_mocov3(q.float(), k.float(), temperature), [q, k])


@pytest.mark.parametrize("n_crops", [2, 4])
def test_dino_loss_matches_the_paper(n_crops):
    s, t, c = _inputs((3 * n_crops, 10), (6, 10), (1, 10))
    ours = dino_loss(s, t, c.detach(), n_crops, 0.1, 0.04)
    ref = reference_dino(s.float(), t.float(), c.detach().float(), n_crops, 0.1, 0.04)
    _same_value_and_grad(ours, ref, [s, t])


def test_dino_teacher_temperature_schedule_and_centre():
    # np.linspace(0.04, 0.07, 30)[e], then 0.07
    assert teacher_temperature(0, 0.07, 0.04, 30) == pytest.approx(0.04)
    assert teacher_temperature(29, 0.07, 0.04, 30) == pytest.approx(0.07)
    assert teacher_temperature(10, 0.07, 0.04, 30) == pytest.approx(0.04 + 0.03 * 10 / 29)
    assert teacher_temperature(500, 0.07, 0.04, 30) == 0.07
    assert teacher_temperature(0, 0.07, 0.04, 0) == 0.07
    center, out = torch.ones(1, 3), torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    torch.testing.assert_close(updated_center(center, out, 0.9),
                               0.9 * center + 0.1 * torch.tensor([[2.0, 3.0, 4.0]]))


# ---- the methods ----------------------------------------------------------------------------
def _method(name, **kw):
    torch.manual_seed(0)
    return build_method(name, backbone="cnn5_small", **{**SMALL[name], **kw})  # 128-d, BN


def _views(name, n=4):
    views = [torch.randn(n, 3, 16, 16) for _ in range(2)]
    return views + [torch.randn(n, 3, 8, 8) for _ in range(2)] if name == "dino" else views


@pytest.mark.parametrize("name", NEW)
def test_one_step_trains_the_student_and_the_teacher_follows_by_ema(name):
    m = _method(name)
    assert name in METHODS and m.name == name
    m.set_epoch(5)
    opt = m.build_optimizer(lr=0.05, weight_decay=1e-4)
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    teacher = dict(m.teacher.named_parameters()) if hasattr(m, "teacher") else {}
    assert all(not p.requires_grad and id(p) not in in_opt for p in teacher.values())
    assert in_opt == {id(p) for p in m.parameters() if p.requires_grad}
    out = m(_views(name))
    assert torch.isfinite(out.loss) and len(out.embeddings) == 2
    assert all(e.grad_fn is not None for e in out.embeddings)  # the add-on's gradient flows
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    out.loss.backward()
    m.after_backward(0)
    opt.step()
    m.after_step(0)
    moved = [k for k, v in m.named_parameters()
             if v.requires_grad and not torch.equal(v, before[k])]
    assert any(k.startswith("backbone.") for k in moved)
    if not teacher:
        return
    mom = m.momentum
    for k, t in m.teacher.named_parameters():  # t <- m t + (1 - m) s, s the updated student
        s = dict(m.named_parameters())[k]
        torch.testing.assert_close(t, mom * before["teacher." + k] + (1 - mom) * s)


@pytest.mark.parametrize("name", ["byol", "mocov3", "dino"])
def test_a_fresh_teacher_is_the_student_and_a_loaded_one_is_kept(name):
    m = _method(name)
    assert not bool(m.teacher_initialized)
    with torch.no_grad():
        for p in m.backbone.parameters():  # as a backbone-only file would load them
            p.add_(1.0)
    m(_views(name))
    assert bool(m.teacher_initialized)
    student = dict(m.backbone.named_parameters())  # (BN statistics moved in the forward)
    for k, v in m.teacher["backbone"].named_parameters():
        assert torch.equal(v, student[k]), k
    rebuilt = build_method(name, **json.loads(json.dumps(m.hparams)))
    key = next(iter(dict(m.teacher["backbone"].named_parameters())))
    with torch.no_grad():
        m.teacher["backbone"].get_parameter(key).fill_(7.0)
    rebuilt.load_state_dict(m.state_dict())
    rebuilt(_views(name))
    assert torch.all(rebuilt.teacher["backbone"].get_parameter(key) == 7.0)  # not overwritten


def test_dino_freezes_the_prototype_layer_in_its_first_epochs_and_clips():
    m = _method("dino", freeze_last_layer=1, clip_grad=0.01, norm_last_layer=False)
    for epoch, frozen in ((0, True), (1, False)):
        m.zero_grad()
        m.set_epoch(epoch)
        m(_views("dino")).loss.backward()
        m.after_backward(0)
        assert (m.head.last_layer.weight_v.grad is None) == frozen
        norms = [p.grad.norm() for p in m.backbone.parameters() if p.grad is not None]
        assert max(norms) <= 0.01 * (1 + 1e-4)
    assert m.head.last_layer.weight_g.requires_grad  # norm_last_layer=False: trained
    assert not _method("dino").head.last_layer.weight_g.requires_grad


def test_dino_centre_moves_in_training_only_and_embeddings_are_the_bottleneck():
    m = _method("dino")
    views = _views("dino")
    with torch.no_grad():
        m(views)
    assert torch.count_nonzero(m.center) == 0  # no gradient: evaluation, the centre stays
    out = m(views)
    assert torch.count_nonzero(m.center) > 0
    assert len(out.all_embeddings) == 4 and out.embeddings[0].shape == (4, 16)
    m.eval()  # BN on running statistics: a crop's features do not depend on the others
    out = m(views)
    torch.testing.assert_close(out.embeddings[1], m.head.bottleneck(m.backbone(views[1])))


@pytest.mark.parametrize("name", NEW)
def test_saved_and_rebuilt_from_the_checkpoint(tmp_path, name):
    from e2mc.checkpoints import load_checkpoint, save_checkpoint

    m = _method(name)
    m(_views(name))  # a teacher set, a centre moved
    save_checkpoint(tmp_path / "m.pt", m, epoch=3)
    loaded, info = load_checkpoint(tmp_path / "m.pt")
    assert type(loaded) is type(m) and info["method"] == name and info["epoch"] == 3
    for k, v in m.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    assert all(not p.requires_grad for n, p in loaded.named_parameters()
               if n.startswith("teacher."))


@pytest.mark.parametrize("name, kw", [
    ("mocov3", {"projector_layers": 3, "predictor_last_bn": True, "temperature": 0.2}),
    ("dino", {"norm_last_layer": False})])
def test_vision_transformers_train_a_step(name, kw):
    pytest.importorskip("timm", reason="the [timm] extra is not installed")
    torch.manual_seed(0)
    m = build_method(name, backbone="timm:test_vit", **{**SMALL[name], **kw})
    opt = m.build_optimizer(lr=1e-3, weight_decay=0.05, optimizer="adamw")
    views = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    if name == "dino":
        views += [torch.randn(4, 3, 16, 16) for _ in range(2)]  # local crops, another size
    m.set_epoch(3)
    out = m(views)
    out.loss.backward()
    m.after_backward(0)
    before = m.backbone.cls_token.detach().clone()
    opt.step()
    m.after_step(0)
    assert torch.isfinite(out.loss) and not torch.equal(m.backbone.cls_token, before)
    if name == "mocov3":
        assert len(m.projector) == 8 and not m.projector[-1].affine  # 3 layers, last BN
        assert isinstance(m.predictor[-1], nn.BatchNorm1d)
