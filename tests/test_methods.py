"""Base losses against the official formulas, Sinkhorn marginals, the SwAV queue, and one
training step per method (finite gradients on trainable parameters, none on frozen ones)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from e2mc.methods import (
    Generic,
    SimSiam,
    SwAV,
    VICReg,
    build_method,
    simsiam_loss,
    sinkhorn,
    vicreg_loss,
)
from reference import reference_vicreg_std_cov


# ---- references written from the official code ---------------------------------------------
def ref_vicreg(x, y, sim=25.0, std=25.0, cov=1.0):
    """main_vicreg.VICReg.forward (single process)."""
    repr_loss = ((x - y) ** 2).mean()
    std_loss, cov_loss = reference_vicreg_std_cov(x, y)
    return sim * repr_loss + std * std_loss + cov * cov_loss, (repr_loss, std_loss, cov_loss)


def ref_sinkhorn(out, eps=0.05, iters=3):
    """main_swav.distributed_sinkhorn with world size 1."""
    Q = torch.exp(out / eps).t()
    B, K = Q.shape[1], Q.shape[0]
    Q = Q / Q.sum()
    for _ in range(iters):
        Q = Q / Q.sum(dim=1, keepdim=True) / K
        Q = Q / Q.sum(dim=0, keepdim=True) / B
    return (Q * B).t()


def ref_swav_loss(output, bs, crops_for_assign, temperature=0.1, queue=None, protos=None):
    """main_swav.train's loss, given prototype scores of all crops (queue used if given)."""
    n_crops = output.shape[0] // bs
    loss = 0
    for i, crop_id in enumerate(crops_for_assign):
        out = output[bs * crop_id: bs * (crop_id + 1)].detach()
        if queue is not None:
            out = torch.cat((queue[i] @ protos.t(), out))
        q = ref_sinkhorn(out)[-bs:]
        subloss = 0
        for v in range(n_crops):
            if v == crop_id:
                continue
            x = output[bs * v: bs * (v + 1)] / temperature
            subloss -= torch.mean(torch.sum(q * F.log_softmax(x, dim=1), dim=1))
        loss += subloss / (n_crops - 1)
    return loss / len(crops_for_assign)


# ---- VICReg ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n,d", [(8, 32), (40, 6)])  # Gram path (n < d) and direct path
def test_vicreg_loss_matches_official(n, d):
    torch.manual_seed(0)
    x, y = torch.randn(n, d, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64) * 0.3
    loss, terms = vicreg_loss(x, y, 25.0, 25.0, 1.0)
    ref, (inv, var, cov) = ref_vicreg(x.float(), y.float())
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(terms["invariance"], inv)
    torch.testing.assert_close(terms["variance"], var)
    torch.testing.assert_close(terms["covariance"], cov, rtol=1e-4, atol=1e-6)


def test_vicreg_embeddings_are_raw_projector_outputs():
    torch.manual_seed(0)
    m = VICReg("resnet18", small_images=True, projector="32-16").eval()
    views = [torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)]
    out = m(views)
    torch.testing.assert_close(out.embeddings[0], m.projector(m.backbone(views[0])))
    assert out.embeddings[1].shape == (4, 16) and out.embeddings[0].requires_grad
    layout = [type(layer).__name__ for layer in m.projector]
    assert layout == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert m.projector[3].bias is None and m.projector[0].bias is not None


# ---- SwAV -----------------------------------------------------------------------------------
def test_sinkhorn_marginals_and_reference():
    torch.manual_seed(0)
    scores = F.normalize(torch.randn(16, 8), dim=1) @ F.normalize(torch.randn(10, 8), dim=1).T
    q = sinkhorn(scores, 0.05, 3)
    torch.testing.assert_close(q, ref_sinkhorn(scores))
    torch.testing.assert_close(q.sum(dim=1), torch.ones(16))  # each sample: a distribution
    q_many = sinkhorn(scores, 0.05, 200)
    torch.testing.assert_close(q_many.sum(dim=0), torch.full((10,), 16 / 10), rtol=1e-3,
                               atol=1e-3)  # equipartition over prototypes
    raw = torch.softmax(scores / 0.05, dim=1).sum(0)
    assert (q.sum(0) - 1.6).abs().max() < (raw - 1.6).abs().max()


def _swav(**kw):
    args = dict(backbone="resnet18", small_images=True, hidden_dim=32, output_dim=16,
                n_prototypes=12, n_crops=(2, 2))
    args.update(kw)
    return SwAV(**args)


def _multicrop(bs=4):
    return [torch.randn(bs, 3, 16, 16) for _ in range(2)] + [
        torch.randn(bs, 3, 8, 8) for _ in range(2)]


def test_swav_loss_matches_official_and_embeddings_are_prenorm():
    torch.manual_seed(0)
    m = _swav()
    views = _multicrop()
    out = m(views)
    proj = torch.cat(out.all_embeddings)
    scores = m.prototypes(F.normalize(proj, dim=1))
    torch.testing.assert_close(out.loss, ref_swav_loss(scores, 4, (0, 1)))
    assert len(out.embeddings) == 2 and len(out.all_embeddings) == 4
    assert not torch.allclose(out.embeddings[0].norm(dim=1), torch.ones(4))
    assert out.embeddings[0].requires_grad


def test_swav_head_runs_on_all_crops_backbone_per_resolution():
    m = _swav()
    calls = []
    m.backbone.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape))
    m(_multicrop(bs=3))
    assert calls == [(6, 3, 16, 16), (6, 3, 8, 8)]


def test_swav_queue_starts_at_epoch_fills_and_is_used():
    torch.manual_seed(0)
    bs = 4
    m = _swav(queue_length=8, queue_start_epoch=2)
    m.set_epoch(1)
    assert m.queue is None
    m(_multicrop(bs))
    m.set_epoch(2)
    assert m.queue.shape == (2, 8, 16) and not m.queue.any()
    out = m(_multicrop(bs))  # first batch: queue not full -> not used
    assert not m.use_the_queue
    proj = torch.cat(out.all_embeddings).detach()
    z = F.normalize(proj, dim=1)
    torch.testing.assert_close(out.loss, ref_swav_loss(m.prototypes(z), bs, (0, 1)))
    torch.testing.assert_close(m.queue[0, :bs], z[:bs])  # newest first, crop 0
    torch.testing.assert_close(m.queue[1, :bs], z[bs:2 * bs])  # crop 1
    assert not m.queue[:, bs:].any()
    m(_multicrop(bs))  # fills the second half: the last row becomes non-zero
    assert m.queue[:, -1].abs().sum() > 0
    queue_before = m.queue.clone()
    out = m(_multicrop(bs))
    assert m.use_the_queue
    z = F.normalize(torch.cat(out.all_embeddings).detach(), dim=1)
    ref = ref_swav_loss(m.prototypes(z), bs, (0, 1), queue=queue_before,
                        protos=m.prototypes.weight)
    torch.testing.assert_close(out.loss, ref)
    state = m.training_state()
    m2 = _swav(queue_length=8, queue_start_epoch=2)
    m2.load_training_state(state)
    torch.testing.assert_close(m2.queue, m.queue)
    assert m2.use_the_queue
    m.set_epoch(3)  # a new epoch keeps the queue but re-checks whether it is full
    assert not m.use_the_queue and m.queue is not None


def test_swav_prototypes_normalised_and_frozen():
    torch.manual_seed(0)
    m = _swav(freeze_prototypes_iters=5)
    with torch.no_grad():
        m.prototypes.weight.mul_(3.0)
    m.before_step(0)
    torch.testing.assert_close(m.prototypes.weight.norm(dim=1), torch.ones(12))
    for iteration, frozen in ((4, True), (5, False)):
        m.zero_grad(set_to_none=True)
        m(_multicrop()).loss.backward()
        m.after_backward(iteration)
        assert (m.prototypes.weight.grad is None) == frozen


# ---- SimSiam --------------------------------------------------------------------------------
def test_simsiam_loss_formula_and_stop_gradient():
    torch.manual_seed(0)
    p1, p2, z1, z2 = (torch.randn(6, 5, requires_grad=True) for _ in range(4))
    loss = simsiam_loss(p1, p2, z1, z2)
    cos = nn.CosineSimilarity(dim=1)
    ref = -(cos(p1, z2).mean() + cos(p2, z1).mean()) * 0.5
    torch.testing.assert_close(loss, ref)
    loss.backward()
    assert z1.grad is None and z2.grad is None  # targets get no gradient
    assert p1.grad is not None and p2.grad is not None


def test_simsiam_layout_and_embeddings():
    m = SimSiam("resnet18", small_images=True, dim=32, pred_dim=8)
    assert [type(x).__name__ for x in m.projector] == [
        "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    assert m.projector[0].bias is None and not m.projector[7].affine
    assert not m.projector[6].bias.requires_grad
    out = m([torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)])
    assert out.embeddings[0].shape == (4, 32) and out.embeddings[0].grad_fn is not None
    opt = m.build_optimizer(0.002, 1e-4, predictor_lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.002, 0.1]
    assert [g["fix_lr"] for g in opt.param_groups] == [False, True]
    predictor = {id(p) for p in m.predictor.parameters()}
    assert {id(p) for p in opt.param_groups[1]["params"]} == predictor


# ---- one training step per method -----------------------------------------------------------
def _step(method, views, iteration=10):
    method.set_epoch(0)
    method.before_step(iteration)
    opt = method.build_optimizer(lr=0.1, weight_decay=1e-4)
    before = {n: p.detach().clone() for n, p in method.named_parameters()}
    out = method(views)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    method.after_backward(iteration)
    grads = {n: p.grad for n, p in method.named_parameters()}
    opt.step()
    changed = {n for n, p in method.named_parameters() if not torch.equal(p, before[n])}
    return grads, changed


@pytest.mark.parametrize("name", ["vicreg", "swav", "simsiam"])
def test_one_training_step(name):
    torch.manual_seed(0)
    kw = {"vicreg": dict(projector="32-32"), "swav": dict(hidden_dim=32, output_dim=16,
          n_prototypes=10, n_crops=(2, 2), freeze_prototypes_iters=20),
          "simsiam": dict(dim=32, pred_dim=8)}[name]
    m = build_method(name, backbone="resnet18", small_images=True, **kw)
    views = _multicrop() if name == "swav" else [torch.randn(4, 3, 16, 16) for _ in range(2)]
    grads, changed = _step(m, views)
    frozen = {"vicreg": set(), "swav": {"prototypes.weight"},
              "simsiam": {"projector.6.bias"}}[name]
    for n, g in grads.items():
        if n in frozen:
            assert g is None, n
        else:
            assert g is not None and torch.isfinite(g).all(), n
    assert frozen.isdisjoint(changed)
    assert len(changed) > 0.9 * (len(grads) - len(frozen))


def test_vicreg_optimizer_groups_exclude_1d():
    m = VICReg("resnet18", small_images=True, projector="16-16")
    opt = m.build_optimizer(0.1, 1e-6)
    adapted, excluded = opt.param_groups
    assert all(p.ndim > 1 for p in adapted["params"]) and adapted["weight_decay"] == 1e-6
    assert all(p.ndim == 1 for p in excluded["params"])
    assert excluded["weight_decay"] == 0 and not excluded["lars_adaptation"]
    assert len(adapted["params"]) + len(excluded["params"]) == len(list(m.parameters()))


# ---- Generic and the registry ---------------------------------------------------------------
class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean(dim=(2, 3))


@pytest.mark.parametrize("loss", ["vicreg", "simsiam"])
def test_generic_with_user_encoder(loss):
    torch.manual_seed(0)
    projector = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16))
    predictor = nn.Sequential(nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 16)) \
        if loss == "simsiam" else None
    m = Generic(TinyEncoder(), projector, loss=loss, predictor=predictor)
    assert m.feature_dim == 8
    assert m.compact_space == ("hypercube" if loss == "vicreg" else "hypersphere")
    views = [torch.randn(6, 1, 12, 12) for _ in range(2)]
    grads, _ = _step(m, views)
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    out = m(views)
    if loss == "vicreg":
        ref, _ = ref_vicreg(out.embeddings[0], out.embeddings[1])
        torch.testing.assert_close(out.loss, ref)


def test_generic_and_registry_errors():
    proj = nn.Linear(8, 4)
    with pytest.raises(ValueError, match="predictor"):
        Generic(TinyEncoder(), proj, loss="simsiam")
    with pytest.raises(ValueError, match="^loss must be one of 'vicreg', 'simsiam', got 'byol'$"):
        Generic(TinyEncoder(), proj, loss="byol")
    with pytest.raises(ValueError, match="feature_dim"):
        Generic(TinyEncoder(), nn.Identity())
    with pytest.raises(ValueError, match="unknown method"):
        build_method("byol2")
    with pytest.raises(ValueError, match="unknown vicreg hyperparameters"):
        build_method("vicreg", backbone="resnet18", mlp="8-8")
    with pytest.raises(ValueError, match="views"):
        VICReg("resnet18", small_images=True, projector="8-8")([torch.randn(2, 3, 16, 16)])
    with pytest.raises(ValueError, match="projector"):
        VICReg("resnet18", projector="8-x")


@pytest.mark.parametrize("name", ["vicreg", "swav", "simsiam"])
def test_hparams_rebuild_the_same_model(name):
    import json

    kw = {"projector": "64-32"} if name == "vicreg" else {}
    m = build_method(name, backbone="resnet18", small_images=True, in_channels=1, **kw)
    rebuilt = build_method(name, **json.loads(json.dumps(m.hparams)))
    shapes = {k: v.shape for k, v in m.state_dict().items()}
    assert shapes == {k: v.shape for k, v in rebuilt.state_dict().items()}
    assert math.isclose(sum(v.numel() for v in m.state_dict().values()),
                        sum(v.numel() for v in rebuilt.state_dict().values()))
