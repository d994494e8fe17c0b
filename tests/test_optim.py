"""LARS and LARC: one and two steps against their formulas (VICReg's LARS, apex's LARC)."""

import pytest
import torch

from e2mc.optim import LARC, LARS


def _param(values):
    p = torch.nn.Parameter(torch.tensor(values, dtype=torch.float64))
    return p


def test_lars_two_steps_match_formula():
    w = _param([[3.0, 4.0], [0.0, 0.0]])  # ||w|| = 5, adapted, weight-decayed
    b = _param([1.0, -2.0])  # 1-D: no decay, no adaptation (VICReg's exclude_bias_and_norm)
    lr, wd, eta, m = 0.5, 0.1, 0.001, 0.9
    opt = LARS([{"params": [w], "weight_decay": wd, "lars_adaptation": True},
                {"params": [b], "weight_decay": 0.0, "lars_adaptation": False}],
               lr=lr, momentum=m, eta=eta)
    g_w = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    g_b = torch.tensor([0.5, 0.5], dtype=torch.float64)
    w0, b0 = w.detach().clone(), b.detach().clone()
    w.grad, b.grad = g_w.clone(), g_b.clone()
    opt.step()
    d = g_w + wd * w0
    mu_w = d * (eta * w0.norm() / d.norm())
    torch.testing.assert_close(w.detach(), w0 - lr * mu_w)
    torch.testing.assert_close(b.detach(), b0 - lr * g_b)
    # second step: momentum accumulates the new scaled update
    w1, b1 = w.detach().clone(), b.detach().clone()
    w.grad, b.grad = g_w.clone(), g_b.clone()
    opt.step()
    d2 = g_w + wd * w1
    mu_w2 = m * mu_w + d2 * (eta * w1.norm() / d2.norm())
    torch.testing.assert_close(w.detach(), w1 - lr * mu_w2)
    torch.testing.assert_close(b.detach(), b1 - lr * (m * g_b + g_b))
    assert set(opt.state[w]) == {"mu"}  # same buffer name as VICReg's checkpoints


def test_lars_zero_norm_uses_factor_one():
    w = _param([0.0, 0.0])
    opt = LARS([w], lr=1.0, eta=0.001, momentum=0.0)
    w.grad = torch.tensor([1.0, 2.0], dtype=torch.float64)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([-1.0, -2.0], dtype=torch.float64))


def test_larc_one_step_matches_apex_formula():
    w = _param([3.0, 4.0])  # ||w|| = 5
    z = _param([1.0, 1.0])  # zero gradient: apex applies neither scaling nor weight decay
    lr, wd, trust, eps = 0.2, 0.01, 0.001, 1e-8
    opt = LARC([w, z], lr=lr, momentum=0.9, weight_decay=wd, trust_coefficient=trust)
    g = torch.tensor([0.6, -0.8], dtype=torch.float64)  # ||g|| = 1
    w0 = w.detach().clone()
    w.grad, z.grad = g.clone(), torch.zeros(2, dtype=torch.float64)
    opt.step()
    a = trust * 5.0 / (1.0 + 5.0 * wd + eps)
    torch.testing.assert_close(w.detach(), w0 - lr * (g + wd * w0) * a)
    torch.testing.assert_close(z.detach(), torch.ones(2, dtype=torch.float64))
    assert opt.param_groups[0]["weight_decay"] == wd  # restored after the step
    # second step: SGD momentum on the rescaled gradient
    buf = opt.state[w]["momentum_buffer"].clone()
    w1 = w.detach().clone()
    w.grad = g.clone()
    opt.step()
    a2 = trust * w1.norm() / (1.0 + w1.norm() * wd + eps)
    torch.testing.assert_close(w.detach(), w1 - lr * (0.9 * buf + (g + wd * w1) * a2))


def test_larc_clip():
    w = _param([3.0, 4.0])
    lr = 1e-5  # adaptive lr / lr > 1 -> clipped to 1: plain SGD with weight decay
    opt = LARC([w], lr=lr, momentum=0.0, weight_decay=0.0, trust_coefficient=0.001, clip=True)
    g = torch.tensor([0.6, -0.8], dtype=torch.float64)
    w0 = w.detach().clone()
    w.grad = g.clone()
    opt.step()
    torch.testing.assert_close(w.detach(), w0 - lr * g)


def test_invalid_settings():
    with pytest.raises(ValueError, match="LARS"):
        LARS([_param([1.0])], lr=-1.0)
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARC([_param([1.0])], lr=0.1, trust_coefficient=0.0)
