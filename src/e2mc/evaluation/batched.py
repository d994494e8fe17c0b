"""Many linear probes trained at once on one cached feature tensor.

Every probe of an evaluation (label fractions x label seeds x a learning-rate / weight-decay
grid, with the per-method presets of :mod:`e2mc.evaluation.presets`) is one *head* of a batched
model. A head is exactly what :func:`e2mc.evaluation.linear.train_linear_probe` trains for the
same settings and seed: the same initialization (N(0, 0.01^2) weights drawn after
``torch.manual_seed(seed)``, zero bias), the same sample order (``randperm`` of a generator
seeded with ``seed``, one per epoch), mini-batches of ``batch_size`` rows of its label subset
(the last one smaller), cross-entropy, SGD with momentum (or SimSiam's LARC, per head), weight
decay, and the per-epoch cosine decay of its learning rate to 0 over its epochs.

How one step serves every head: heads that see the same rows in the same order -- same label
subset, seed, batch size and standardization, e.g. the points of a learning-rate grid -- share a
*stream*. Streams with the same batch size form a *group* whose weights are one
``[streams, D, heads_per_stream * C]`` tensor; a training step gathers each stream's batch from
the one feature tensor into ``[streams, B, D]`` and does one ``torch.baddbmm`` forward and one
``torch.bmm`` for the weight gradient (the softmax cross-entropy gradient is written out, no
autograd). The optimizer update is elementwise over all heads, with per-head learning rate,
weight decay, momentum and LARC flag. A head that has finished its epochs stops changing; a
stream whose heads have all finished leaves the batch (streams are sorted by length, so the
active ones are a prefix). After each epoch of a stream its heads are evaluated on their
evaluation rows (top-1/top-5, cross-entropy), which gives the same last/best-epoch numbers as
the sequential probe.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from e2mc.evaluation.linear import EpochTracker, ProbeResult, init_head
from e2mc.evaluation.presets import LinearProbeConfig
from e2mc.optim import LARC_EPS, LARC_TRUST, cosine_factor

#: Elements (rows x dim) of evaluation features kept gathered / standardized per stream.
EVAL_CACHE_ELEMENTS = 1 << 28


@dataclass(eq=False)
class HeadSpec:
    """One probe: train on ``train_x[rows]`` with ``config`` and ``seed``; evaluate on
    ``eval_x[eval_rows]`` (all rows when None) after every epoch (``history``) or only after
    the last one."""

    rows: np.ndarray
    config: LinearProbeConfig
    seed: int = 0
    eval_rows: np.ndarray | None = None
    history: bool = True

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.int64)
        if self.rows.ndim != 1 or self.rows.size == 0:
            raise ValueError("a head needs a non-empty 1-D array of training rows")
        if self.eval_rows is not None:
            self.eval_rows = np.asarray(self.eval_rows, dtype=np.int64)
            if self.eval_rows.ndim != 1 or self.eval_rows.size == 0:
                raise ValueError("eval_rows must be a non-empty 1-D array (or None)")


def _digest(a: np.ndarray | None) -> str | None:
    return None if a is None else hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()


@dataclass(eq=False)
class _Stream:
    rows: np.ndarray
    seed: int
    batch_size: int
    standardize: bool
    eval_rows: np.ndarray | None
    heads: list[int] = field(default_factory=list)
    # filled in by the engine
    n: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    offset: int = 0           # where the stream's rows start in the bank (standardized copy)
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None
    generator: torch.Generator | None = None
    eval_x: torch.Tensor | None = None   # the stream's evaluation rows, gathered/standardized


@dataclass
class _Group:
    """Streams of one batch size, sorted by number of steps (longest first)."""

    batch_size: int
    streams: list[_Stream]
    slots: int                 # heads per stream (padded)
    weight: torch.Tensor       # [S, D, slots * C]
    bias: torch.Tensor         # [S, 1, slots * C]
    buf_w: torch.Tensor
    buf_b: torch.Tensor
    lr_table: torch.Tensor     # [S, max_epochs + 1, slots]: lr of each epoch, 0 when finished
    wd: torch.Tensor           # [S, 1, slots, 1]
    momentum: torch.Tensor     # [S, 1, slots, 1]
    lars: torch.Tensor         # [S, 1, slots, 1] bool
    any_lars: bool
    idx: torch.Tensor          # [S, max_steps_per_epoch, B] bank rows of the current epoch
    row_w: torch.Tensor        # [S, max_steps_per_epoch, B] 1 / batch length (0 = padding)
    spe: torch.Tensor          # [S] steps per epoch
    total: list[int]           # steps of each stream


def train_linear_heads(
    train_x: np.ndarray | torch.Tensor,
    train_y: np.ndarray | torch.Tensor,
    eval_x: np.ndarray | torch.Tensor,
    eval_y: np.ndarray | torch.Tensor,
    heads: Sequence[HeadSpec],
    num_classes: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    keep_weights: bool = False,
    eval_chunk: int = 8192,
    trace: Counter | None = None,
) -> list[ProbeResult]:
    """Train every head of ``heads`` at once; one :class:`ProbeResult` per head, in order.

    ``train_x [N, D]`` / ``train_y [N]`` hold every training row the heads index;
    ``eval_x`` / ``eval_y`` the evaluation rows (the test split, or the training features
    themselves for validation heads with ``eval_rows``). ``trace`` (a ``Counter``), when given,
    receives the shapes of every matrix product, for a floor measurement.
    """
    if not heads:
        raise ValueError("no heads to train")
    device = torch.device(device)
    x_all = torch.as_tensor(train_x, device=device).to(dtype)
    y_all = torch.as_tensor(np.asarray(train_y), device=device).long()
    ex_all = torch.as_tensor(eval_x, device=device).to(dtype)
    ey_all = torch.as_tensor(np.asarray(eval_y), device=device).long()
    if x_all.ndim != 2 or ex_all.ndim != 2 or x_all.shape[1] != ex_all.shape[1]:
        raise ValueError(f"features must be [N, D] with the same D, got {tuple(x_all.shape)} "
                         f"and {tuple(ex_all.shape)}")
    if y_all.shape != (len(x_all),) or ey_all.shape != (len(ex_all),):
        raise ValueError("labels must be 1-D class indices, one per feature row")
    for h in heads:
        if h.rows.max() >= len(x_all) or h.rows.min() < 0:
            raise ValueError(f"training rows out of range for {len(x_all)} feature rows")
        if h.eval_rows is not None and (h.eval_rows.max() >= len(ex_all)
                                        or h.eval_rows.min() < 0):
            raise ValueError(f"evaluation rows out of range for {len(ex_all)} rows")
    dim = x_all.shape[1]
    classes = num_classes or int(max(y_all.max().item(), ey_all.max().item())) + 1

    # ---- streams: heads that see the same batches
    streams: dict[tuple, _Stream] = {}
    head_stream: list[tuple[_Stream, int]] = []
    for i, h in enumerate(heads):
        key = (_digest(h.rows), h.seed, h.config.batch_size, h.config.standardize,
               _digest(h.eval_rows))
        s = streams.get(key)
        if s is None:
            s = streams[key] = _Stream(h.rows, h.seed, h.config.batch_size,
                                       h.config.standardize, h.eval_rows)
        head_stream.append((s, len(s.heads)))
        s.heads.append(i)

    # ---- the bank: raw features, plus one standardized copy per standardized row set
    pieces: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    size = 0
    copies: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}
    need_raw = any(not s.standardize for s in streams.values())
    if need_raw:
        pieces.append(x_all)
        labels.append(y_all)
        size = len(x_all)
    for s in streams.values():
        s.n = len(s.rows)
        s.steps_per_epoch = -(-s.n // s.batch_size)
        s.total_steps = s.steps_per_epoch * max(heads[i].config.epochs for i in s.heads)
        s.generator = torch.Generator(device="cpu").manual_seed(s.seed)
        if s.standardize:
            digest = _digest(s.rows)
            if digest not in copies:
                sub = x_all[torch.as_tensor(s.rows, device=device)]
                mean = sub.mean(dim=0)
                std = sub.std(dim=0, unbiased=False).clamp_min(1e-6)
                pieces.append((sub - mean) / std)
                labels.append(y_all[torch.as_tensor(s.rows, device=device)])
                copies[digest] = (size, mean, std)
                size += len(sub)
            s.offset, s.mean, s.std = copies[digest]
    # Evaluation rows prepared once per (rows, standardization) while they fit the budget.
    prepared: dict[tuple, torch.Tensor] = {}
    budget = EVAL_CACHE_ELEMENTS
    for s in streams.values():
        if s.eval_rows is None and not s.standardize:
            continue
        key = (_digest(s.eval_rows), _digest(s.rows) if s.standardize else None)
        if key not in prepared:
            n_eval = len(ex_all) if s.eval_rows is None else len(s.eval_rows)
            if n_eval * dim > budget:
                continue
            budget -= n_eval * dim
            ex = ex_all if s.eval_rows is None else \
                ex_all[torch.as_tensor(s.eval_rows, device=device)]
            prepared[key] = (ex - s.mean) / s.std if s.standardize else ex
        s.eval_x = prepared[key]
    bank = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    bank_y = labels[0] if len(labels) == 1 else torch.cat(labels)
    del pieces, labels

    # ---- groups by batch size
    groups: list[_Group] = []
    for batch_size in sorted({s.batch_size for s in streams.values()}):
        members = sorted((s for s in streams.values() if s.batch_size == batch_size),
                         key=lambda s: -s.total_steps)
        groups.append(_build_group(members, heads, dim, classes, device, dtype))

    trackers = [EpochTracker(ey_all if h.eval_rows is None
                        else ey_all[torch.as_tensor(h.eval_rows, device=device)])
                for h in heads]
    for group in groups:
        _run_group(group, heads, bank, bank_y, ex_all, ey_all, classes, trackers,
                   eval_chunk, trace)

    results = []
    for i, tracker in enumerate(trackers):
        result = tracker.result()
        if keep_weights:
            s, slot = head_stream[i]
            group = next(g for g in groups if s in g.streams)
            j = group.streams.index(s)
            w = group.weight[j].view(dim, group.slots, classes)[:, slot]
            b = group.bias[j].view(group.slots, classes)[slot]
            result.weight = w.detach().cpu().numpy().copy()
            result.bias = b.detach().cpu().numpy().copy()
        results.append(result)
    return results


def _build_group(members: list[_Stream], heads: Sequence[HeadSpec], dim: int, classes: int,
                 device: torch.device, dtype: torch.dtype) -> _Group:
    slots = max(len(s.heads) for s in members)
    n_streams = len(members)
    max_epochs = max(heads[i].config.epochs for s in members for i in s.heads)
    weight = torch.zeros(n_streams, dim, slots, classes, dtype=dtype)
    bias = torch.zeros(n_streams, 1, slots, classes, dtype=dtype)
    lr_table = torch.zeros(n_streams, max_epochs + 1, slots, dtype=dtype)
    wd = torch.zeros(n_streams, 1, slots, 1, dtype=dtype)
    momentum = torch.zeros(n_streams, 1, slots, 1, dtype=dtype)
    lars = torch.zeros(n_streams, 1, slots, 1, dtype=torch.bool)
    for j, s in enumerate(members):
        for slot, i in enumerate(s.heads):
            cfg = heads[i].config
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(heads[i].seed)
                head = init_head(dim, classes)
            weight[j, :, slot] = head.weight.detach().T.to(dtype)
            bias[j, 0, slot] = head.bias.detach().to(dtype)
            for e in range(cfg.epochs):
                lr_table[j, e, slot] = cfg.lr * cosine_factor(e, cfg.epochs)
            wd[j, 0, slot, 0] = cfg.weight_decay
            momentum[j, 0, slot, 0] = cfg.momentum
            lars[j, 0, slot, 0] = cfg.optimizer == "lars"
    max_spe = max(s.steps_per_epoch for s in members)
    batch = members[0].batch_size
    row_w = torch.zeros(n_streams, max_spe, batch, dtype=dtype)
    for j, s in enumerate(members):
        for step in range(s.steps_per_epoch):
            length = min(batch, s.n - step * batch)
            row_w[j, step, :length] = 1.0 / length
    return _Group(
        batch_size=batch, streams=members, slots=slots,
        weight=weight.view(n_streams, dim, slots * classes).to(device),
        bias=bias.view(n_streams, 1, slots * classes).to(device),
        buf_w=torch.zeros(n_streams, dim, slots * classes, dtype=dtype, device=device),
        buf_b=torch.zeros(n_streams, 1, slots * classes, dtype=dtype, device=device),
        lr_table=lr_table.to(device), wd=wd.to(device), momentum=momentum.to(device),
        lars=lars.to(device), any_lars=bool(lars.any()),
        idx=torch.zeros(n_streams, max_spe, batch, dtype=torch.long, device=device),
        row_w=row_w.to(device),
        spe=torch.tensor([s.steps_per_epoch for s in members], device=device),
        total=[s.total_steps for s in members])


def _new_epoch(group: _Group, j: int, s: _Stream, device: torch.device) -> None:
    """Draw stream ``j``'s permutation of the epoch and lay it out as ``[steps, B]`` rows."""
    assert s.generator is not None
    order = torch.randperm(s.n, generator=s.generator)
    # a standardized stream reads its own copy of its rows, a raw one the feature tensor
    rows = order + s.offset if s.standardize else torch.as_tensor(s.rows)[order]
    pad = s.steps_per_epoch * s.batch_size - s.n
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad)])
    group.idx[j, :s.steps_per_epoch] = rows.view(s.steps_per_epoch, s.batch_size).to(device)


@torch.no_grad()
def _run_group(group: _Group, heads: Sequence[HeadSpec], bank: torch.Tensor,
               bank_y: torch.Tensor, ex_all: torch.Tensor, ey_all: torch.Tensor, classes: int,
               trackers: list[EpochTracker], eval_chunk: int, trace: Counter | None) -> None:
    device = bank.device
    dim = bank.shape[1]
    slots, batch = group.slots, group.batch_size
    n_streams = len(group.streams)
    arange = torch.arange(n_streams, device=device)
    spe_list = [s.steps_per_epoch for s in group.streams]
    for step in range(group.total[0]):
        active = sum(1 for t in group.total if t > step)
        for j in range(active):
            if step % spe_list[j] == 0:
                _new_epoch(group, j, group.streams[j], device)
        ar = arange[:active]
        in_epoch = step % group.spe[:active]
        epoch = step // group.spe[:active]
        idx = group.idx[ar, in_epoch]                              # [A, B]
        row_w = group.row_w[ar, in_epoch]                          # [A, B]
        xb = bank.index_select(0, idx.reshape(-1)).view(active, batch, dim)
        yb = bank_y.index_select(0, idx.reshape(-1)).view(active, batch)
        w = group.weight[:active]
        b = group.bias[:active]
        logits = torch.baddbmm(b, xb, w).view(active, batch, slots, classes)
        grad = torch.softmax(logits, dim=-1)
        grad.scatter_add_(-1, yb.view(active, batch, 1, 1).expand(active, batch, slots, 1),
                          grad.new_full((1, 1, 1, 1), -1.0).expand(active, batch, slots, 1))
        grad.mul_(row_w.view(active, batch, 1, 1))
        grad = grad.view(active, batch, slots * classes)
        grad_w = torch.bmm(xb.transpose(1, 2), grad)               # [A, D, slots * C]
        grad_b = grad.sum(dim=1, keepdim=True)                     # [A, 1, slots * C]
        if trace is not None:
            trace[("train", active, batch, dim, slots * classes)] += 1
        lr = group.lr_table[ar, epoch].view(active, 1, slots, 1)   # 0 once a head is done
        _update(w.view(active, dim, slots, classes), grad_w.view(active, dim, slots, classes),
                group.buf_w[:active].view(active, dim, slots, classes), lr, group, active)
        _update(b.view(active, 1, slots, classes), grad_b.view(active, 1, slots, classes),
                group.buf_b[:active].view(active, 1, slots, classes), lr, group, active)
        for j in range(active):
            if (step + 1) % spe_list[j] == 0:
                _evaluate(group, j, (step + 1) // spe_list[j], heads, ex_all, ey_all, classes,
                          trackers, eval_chunk, trace)


def _update(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: torch.Tensor,
            group: _Group, active: int) -> None:
    """SGD with momentum and weight decay, or apex LARC (per head), in place.

    Shapes ``[A, R, slots, C]``: a head's parameter is ``[:, :, slot, :]``. LARC, per head and
    per parameter: ``a = trust ||p|| / (||g|| + wd ||p|| + eps)``, ``g <- (g + wd p) a`` when
    both norms are non-zero, else ``g`` unchanged (no weight decay), then plain SGD momentum.
    """
    wd = group.wd[:active]
    if group.any_lars:
        p_norm = param.pow(2).sum(dim=(1, 3), keepdim=True).sqrt()
        g_norm = grad.pow(2).sum(dim=(1, 3), keepdim=True).sqrt()
        lars = group.lars[:active]
        ok = lars & (p_norm != 0) & (g_norm != 0)
        scale = torch.where(ok, LARC_TRUST * p_norm / (g_norm + p_norm * wd + LARC_EPS),
                            torch.ones_like(p_norm))
        wd = torch.where(lars & ~ok, torch.zeros_like(wd), wd)
        grad = (grad + wd * param) * scale
    else:
        grad = grad + wd * param
    buf.mul_(group.momentum[:active]).add_(grad)
    param.sub_(lr * buf)


def _evaluate(group: _Group, j: int, epochs_done: int, heads: Sequence[HeadSpec],
              ex_all: torch.Tensor, ey_all: torch.Tensor, classes: int,
              records: list[EpochTracker], chunk: int, trace: Counter | None) -> None:
    """Top-1/top-5 accuracy of the stream's heads that just finished an epoch.

    First pass, all heads, in the ``[heads, C, rows]`` layout: a row is a top-1 (top-5) hit
    when no (fewer than 5) class scores above its label's; the cross-entropy only after a
    head's last epoch. Second pass, only for heads with a new best top-1 or at their last epoch:
    the argmax predictions, and at the last epoch the top-5 labels (stable sort: ties to the
    lower class).
    """
    s = group.streams[j]
    sel = [(slot, i) for slot, i in enumerate(s.heads)
           if heads[i].config.epochs >= epochs_done
           and (heads[i].history or heads[i].config.epochs == epochs_done)]
    if not sel:
        return
    device = ex_all.device
    dim = group.weight.shape[1]
    n_sel = len(sel)
    final = [heads[i].config.epochs == epochs_done for _, i in sel]
    cols = torch.tensor([slot * classes + c for slot, _ in sel for c in range(classes)],
                        device=device)
    w = group.weight[j].index_select(1, cols)                    # [D, G * C]
    b = group.bias[j, 0].index_select(0, cols)                   # [G * C]
    finite = (torch.isfinite(w).all(dim=0) & torch.isfinite(b)).view(n_sel, classes).all(1)
    rows = None if s.eval_rows is None else torch.as_tensor(s.eval_rows, device=device)
    n = len(ex_all) if rows is None else len(rows)
    eval_y = records[sel[0][1]].labels
    k = min(5, classes)

    def batches():
        for start in range(0, n, chunk):
            if s.eval_x is not None:  # prepared once
                yield s.eval_x[start:start + chunk], eval_y[start:start + chunk]
                continue
            if rows is None:
                x, y = ex_all[start:start + chunk], ey_all[start:start + chunk]
            else:
                x, y = ex_all[rows[start:start + chunk]], ey_all[rows[start:start + chunk]]
            yield (x - s.mean) / s.std if s.standardize else x, y

    hits1 = torch.zeros(n_sel, dtype=torch.long, device=device)
    hits5 = torch.zeros_like(hits1)
    loss = torch.zeros(n_sel, dtype=torch.float64, device=device)
    for x, y in batches():
        m = len(x)
        logits = torch.addmm(b[:, None], w.T, x.T).view(n_sel, classes, m)
        if trace is not None:
            trace[("eval", m, dim, n_sel * classes)] += 1
        picked = logits.gather(1, y.view(1, 1, m).expand(n_sel, 1, m))
        above = (logits > picked).sum(dim=1)                      # [G, m]
        hits1 += (above == 0).sum(dim=1)
        hits5 += (above < k).sum(dim=1)
        if any(final):
            loss += (torch.logsumexp(logits, dim=1) - picked[:, 0]).sum(dim=1).double()
    # as the sequential probe computes it: a float32 mean of 0/1 hits, times 100 in Python
    top1 = [100.0 * v for v in (hits1.float() / n * finite).tolist()]
    top5 = [100.0 * v for v in (hits5.float() / n * finite).tolist()]
    loss_mean = (loss / n).tolist()

    need = [g for g, (_, i) in enumerate(sel) if final[g] or top1[g] > records[i].best[0]]
    preds: dict[int, list[torch.Tensor]] = {g: [] for g in need}
    tops: dict[int, list[torch.Tensor]] = {g: [] for g in need if final[g]}
    if need:
        sub_cols = torch.tensor([g * classes + c for g in need for c in range(classes)],
                                device=device)
        w_sub, b_sub = w.index_select(1, sub_cols), b.index_select(0, sub_cols)
        for x, _ in batches():
            logits = torch.addmm(b_sub, x, w_sub).view(len(x), len(need), classes)
            if trace is not None:
                trace[("eval", len(x), dim, len(need) * classes)] += 1
            arg = logits.argmax(dim=-1)
            for pos, g in enumerate(need):
                if final[g]:
                    order = torch.sort(logits[:, pos], dim=-1, descending=True,
                                       stable=True).indices[:, :k]
                    tops[g].append(order)
                preds[g].append(arg[:, pos])
    for g, (_, i) in enumerate(sel):  # the last call of a head is its final epoch
        records[i].add(top1[g], top5[g], torch.cat(preds[g]) if g in preds else None,
                       torch.cat(tops[g]) if final[g] else None,
                       loss_mean[g] if final[g] else float("nan"))
