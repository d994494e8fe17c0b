"""Reference formulas written from the paper and the official code, for tests only.

Straightforward on purpose: direct d x d covariance, plain torch.sort under autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_entropy(x: torch.Tensor, m: int, eps: float = 1e-7) -> torch.Tensor:
    """Paper Algorithm 1 (m_spacings_estimator) per column, plain torch.sort under autograd."""
    n = x.shape[0]
    s, _ = torch.sort(x, dim=0)
    spacings = (s[m:] - s[: n - m]) * (n + 1) / m
    return torch.log(spacings + eps).sum(dim=0) / (n - m)


def reference_covariance(x: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Paper appendix form: (1/d) sum_{j != k} C_jk^2 with the direct d x d covariance."""
    rows, d = x.shape
    n = rows if n is None else n
    xc = x - x.mean(dim=0)
    cov = xc.T @ xc / (n - 1)
    off = cov - torch.diag(torch.diag(cov))
    return off.pow(2).sum() / d


def reference_e2mc(za, zb, space, beta, gamma, reduction="mean", n=None):
    """Paper Algorithm 1 with the authors' view reduction (mean) or the paper's (sum)."""
    psi = torch.sigmoid if space == "hypercube" else torch.special.ndtr
    ents, covs = [], []
    for z in (za, zb):
        zc = psi(z)
        ents.append(reference_entropy(zc, round(z.shape[0] ** 0.5)).mean())
        covs.append(reference_covariance(zc, n))
    ent = (ents[0] + ents[1]) / (2 if reduction == "mean" else 1)
    return -beta * ent + gamma * (covs[0] + covs[1])


def reference_vicreg_std_cov(x, y):
    """VICReg official: std_loss averaged over views, cov_loss summed (divided by n-1 and d)."""
    n, d = x.shape
    x = x - x.mean(dim=0)
    y = y - y.mean(dim=0)
    std_x = torch.sqrt(x.var(dim=0) + 0.0001)
    std_y = torch.sqrt(y.var(dim=0) + 0.0001)
    std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
    cov_x = (x.T @ x) / (n - 1)
    cov_y = (y.T @ y) / (n - 1)
    off = ~torch.eye(d, dtype=torch.bool)
    cov_loss = cov_x[off].pow(2).sum() / d + cov_y[off].pow(2).sum() / d
    return std_loss, cov_loss


def reference_uniformity(x, t=2.0):
    """Wang & Isola (2020): log of the mean Gaussian potential over distinct pairs."""
    x = F.normalize(x, dim=1)
    return torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log()


def reference_nuclear_norm_of_centroids(views):
    c = torch.stack([F.normalize(z, dim=1) for z in views]).mean(dim=0)
    return torch.linalg.matrix_norm(c, ord="nuc")


# ---- the SSL losses of the methods beyond the paper's three, written from each paper ---------
def reference_barlowtwins(z1, z2, lambd=0.0051, eps=1e-5):
    """Barlow Twins (Zbontar et al., 2021, Eq. 1-2): cross-correlation of the batch-standardised
    embeddings, sum_i (1 - C_ii)^2 + lambda sum_{i != j} C_ij^2, written with explicit sums."""
    n, d = z1.shape
    a = (z1 - z1.mean(0)) / torch.sqrt(z1.var(0, unbiased=False) + eps)
    b = (z2 - z2.mean(0)) / torch.sqrt(z2.var(0, unbiased=False) + eps)
    c = torch.einsum("ni,nj->ij", a, b) / n
    eye = torch.eye(d, dtype=torch.bool)
    return ((1 - c[eye]) ** 2).sum() + lambd * (c[~eye] ** 2).sum()


def reference_nt_xent(z1, z2, temperature):
    """SimCLR (Chen et al., 2020, Eq. 1 and Algorithm 1): the 2N x 2N cosine-similarity matrix,
    l(i, j) = -log exp(s_ij / t) / sum_{k != i} exp(s_ik / t), averaged over the 2N positives."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n2 = z.shape[0]
    n = n2 // 2
    s = z @ z.T / temperature
    total = 0.0
    for i in range(n2):
        j = (i + n) % n2
        others = torch.cat([s[i, :i], s[i, i + 1:]])
        total = total - (s[i, j] - torch.logsumexp(others, dim=0))
    return total / n2


def reference_byol(p1, p2, t1, t2):
    """BYOL (Grill et al., 2020, Eq. 2): || p/|p| - t/|t| ||^2 per sample, mean, symmetrised."""
    def dist(p, t):
        return ((p / p.norm(dim=1, keepdim=True) - t / t.norm(dim=1, keepdim=True)) ** 2).sum(1)
    return dist(p1, t2.detach()).mean() + dist(p2, t1.detach()).mean()


def reference_mocov3(q, k, temperature):
    """MoCo v3 (Chen et al., 2021, Eq. 1 and Algorithm 1): InfoNCE of each query against all keys
    of the batch (positive: the same image), times 2t."""
    q = q / q.norm(dim=1, keepdim=True)
    k = k.detach() / k.detach().norm(dim=1, keepdim=True)
    logits = q @ k.T / temperature
    log_p = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    return -torch.diagonal(log_p).mean() * 2 * temperature


def reference_dino(student_out, teacher_out, center, n_crops, student_temp, teacher_temp):
    """DINO (Caron et al., 2021, Eq. 2-3 and Algorithm 1): H(P_t(x), P_s(x')) summed over pairs
    of a global teacher crop and a different student crop, averaged over pairs and samples."""
    b = teacher_out.shape[0] // 2
    pt = torch.softmax((teacher_out.detach() - center) / teacher_temp, dim=1)
    ls = torch.log_softmax(student_out / student_temp, dim=1)
    total, pairs = 0.0, 0
    for t in range(2):
        for s in range(n_crops):
            if s == t:
                continue
            ce = -(pt[t * b:(t + 1) * b] * ls[s * b:(s + 1) * b]).sum(1)
            total, pairs = total + ce.mean(), pairs + 1
    return total / pairs


# ---- the linear probe, one at a time: the oracle of the batched heads ------------------------
def train_linear_probe(train_x, train_y, test_x, test_y, config=None, seed=0, num_classes=None,
                       device="cpu", dtype=torch.float32, keep_weights=False):
    """The linear protocol (docs/method.md) written the plain way: ``nn.Linear`` initialised by
    :func:`e2mc.evaluation.linear.init_head` after ``torch.manual_seed(seed)``, torch's SGD with
    momentum (or :class:`e2mc.optim.LARC`) under autograd, cross-entropy, mini-batches of a
    ``randperm`` of a generator seeded with ``seed``, the per-epoch cosine decay to 0, and the
    test set scored after every epoch. :func:`e2mc.evaluation.batched.train_linear_heads` must
    give each head the same numbers (tests/test_eval_batched.py)."""
    import numpy as np

    from e2mc.evaluation.linear import EpochTracker, init_head
    from e2mc.evaluation.probe_settings import LinearProbeConfig
    from e2mc.optim import LARC, cosine_factor

    config = config or LinearProbeConfig()
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    num_classes = num_classes or int(max(train_y.max(), test_y.max())) + 1
    x = torch.as_tensor(train_x, device=device).to(dtype)
    tx = torch.as_tensor(test_x, device=device).to(dtype)
    if config.standardize:
        mean, std = x.mean(dim=0), x.std(dim=0, unbiased=False).clamp_min(1e-6)
        x, tx = (x - mean) / std, (tx - mean) / std
    y = torch.as_tensor(train_y, dtype=torch.long, device=device)
    torch.manual_seed(seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    head = init_head(x.shape[1], num_classes).to(device=device, dtype=dtype)
    kind = torch.optim.SGD if config.optimizer == "sgd" else LARC
    optimizer = kind(head.parameters(), lr=config.lr, momentum=config.momentum,
                     weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda e: cosine_factor(e, config.epochs))
    tracker = EpochTracker(torch.as_tensor(test_y, dtype=torch.long, device=device))
    for _ in range(config.epochs):
        order = torch.randperm(len(x), generator=gen).to(device)
        for start in range(0, len(x), config.batch_size):
            idx = order[start:start + config.batch_size]
            loss = F.cross_entropy(head(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        schedule.step()
        with torch.no_grad():
            tracker.update(head(tx))
    result = tracker.result()
    if keep_weights:
        result.weight = head.weight.detach().T.cpu().numpy().copy()
        result.bias = head.bias.detach().cpu().numpy().copy()
    return result


def sequential_linear_sweep(train_x, train_y, test_x, test_y, fractions, seeds, config_for,
                            device="cpu"):
    """One :func:`train_linear_probe` per (fraction, seed) after another, on the stratified
    subset :func:`e2mc.data.subsets.label_fraction_indices` draws: ``{fraction: [(seed,
    result), ...]}``, the probes that :func:`e2mc.evaluation.sweep.linear_protocol` batches."""
    import numpy as np

    from e2mc.data.subsets import label_fraction_indices

    num_classes = int(max(np.max(train_y), np.max(test_y))) + 1
    out = {}
    for fraction in fractions:
        out[fraction] = []
        for seed in seeds:
            idx = label_fraction_indices(train_y, fraction, seed)
            out[fraction].append((seed, train_linear_probe(
                train_x[idx], train_y[idx], test_x, test_y, config_for(fraction), seed=seed,
                num_classes=num_classes, device=device)))
    return out
