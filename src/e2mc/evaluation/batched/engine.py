"""The training of a group of streams: weights and biases as one ``[streams, D + 1, slots * C]``
tensor (biases last), each step one gather, one ``baddbmm`` forward, one ``bmm`` for the
written-out gradient and one elementwise SGD / LARC update with each head's settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from e2mc.evaluation.batched.plan import HeadSpec, Stream, digest
from e2mc.evaluation.linear import init_head
from e2mc.optim import cosine_factor, larc_trust_ratio


def build_bank(x_all: torch.Tensor, y_all: torch.Tensor, streams: Sequence[Stream]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows the streams train on and their labels: the raw features (when a stream reads
    them), then one standardized copy per row set (setting its streams' offset, mean, std)."""
    pieces: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    size = 0
    copies: dict[str | None, tuple[int, torch.Tensor, torch.Tensor]] = {}
    if any(not s.standardize for s in streams):
        pieces.append(x_all)
        labels.append(y_all)
        size = len(x_all)
    for s in streams:
        if not s.standardize:
            continue
        key = digest(s.rows)
        if key not in copies:
            rows = torch.as_tensor(s.rows, device=x_all.device)
            sub = x_all[rows]
            mean = sub.mean(dim=0)
            std = sub.std(dim=0, unbiased=False).clamp_min(1e-6)
            pieces.append((sub - mean) / std)
            labels.append(y_all[rows])
            copies[key] = (size, mean, std)
            size += len(sub)
        s.offset, s.mean, s.std = copies[key]
    bank = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    bank_y = labels[0] if len(labels) == 1 else torch.cat(labels)
    return bank, bank_y


@dataclass
class Group:
    """Streams of one batch size, sorted by number of steps (longest first)."""

    batch_size: int
    streams: list[Stream]
    slots: int                 # heads per stream (padded)
    classes: int
    params: torch.Tensor       # [S, D + 1, slots * C]: the weights, then the biases' row
    buf: torch.Tensor          # its momentum buffer
    grad: torch.Tensor         # its gradient (written at every step)
    # per column of the weights (a head's value repeated over its C classes), so that the
    # update broadcasts only over rows, on contiguous rows of slots * C values
    lr_table: torch.Tensor     # [S, max_epochs + 1, slots * C]: lr of each epoch, 0 when done
    wd: torch.Tensor           # [S, 1, slots * C]
    momentum: torch.Tensor     # [S, 1, slots * C]
    lars: torch.Tensor         # [S, 1, slots, 1] bool
    any_lars: bool
    idx: torch.Tensor          # [S, max_steps_per_epoch, B] bank rows of the current epoch
    labels: torch.Tensor       # [S, max_steps_per_epoch, B] their labels
    row_w: torch.Tensor        # [S, max_steps_per_epoch, B] 1 / batch length (0 = padding)
    steps_per_epoch: torch.Tensor          # [S] steps per epoch
    generators: list[torch.Generator]  # each stream's sample order (seeded with its seed)

    @property
    def weight(self) -> torch.Tensor:  # [S, D, slots * C], a view
        return self.params[:, :-1]

    @property
    def bias(self) -> torch.Tensor:  # [S, 1, slots * C], a view
        return self.params[:, -1:]


def build_group(members: list[Stream], heads: Sequence[HeadSpec], dim: int, classes: int,
                device: torch.device, dtype: torch.dtype) -> Group:
    """A group's weights (each head initialized as :func:`~e2mc.evaluation.linear.init_head`
    after ``torch.manual_seed(seed)``), optimizer state and per-head settings."""
    slots = max(len(s.heads) for s in members)
    n_streams = len(members)
    params = torch.zeros(n_streams, dim + 1, slots, classes, dtype=dtype)
    for j, s in enumerate(members):
        for slot, i in enumerate(s.heads):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(heads[i].seed)
                head = init_head(dim, classes)
            params[j, :dim, slot] = head.weight.detach().T.to(dtype)
            params[j, dim, slot] = head.bias.detach().to(dtype)
    lr_table, wd, momentum, lars = _head_settings(members, heads, slots, dtype)
    lr_table, wd, momentum = (t.repeat_interleave(classes, dim=2).view(n_streams, -1,
                                                                       slots * classes)
                              for t in (lr_table, wd, momentum))
    max_spe = max(s.steps_per_epoch for s in members)
    batch = members[0].batch_size
    row_w = torch.zeros(n_streams, max_spe, batch, dtype=dtype)
    for j, s in enumerate(members):
        for step in range(s.steps_per_epoch):
            length = min(batch, s.n - step * batch)
            row_w[j, step, :length] = 1.0 / length
    return Group(
        batch_size=batch, streams=members, slots=slots, classes=classes,
        params=params.view(n_streams, dim + 1, slots * classes).to(device),
        buf=torch.zeros(n_streams, dim + 1, slots * classes, dtype=dtype, device=device),
        grad=torch.zeros(n_streams, dim + 1, slots * classes, dtype=dtype, device=device),
        lr_table=lr_table.to(device), wd=wd.to(device), momentum=momentum.to(device),
        lars=lars.to(device), any_lars=bool(lars.any()),
        idx=torch.zeros(n_streams, max_spe, batch, dtype=torch.long, device=device),
        labels=torch.zeros(n_streams, max_spe, batch, dtype=torch.long, device=device),
        row_w=row_w.to(device),
        steps_per_epoch=torch.tensor([s.steps_per_epoch for s in members], device=device),
        generators=[torch.Generator(device="cpu").manual_seed(s.seed) for s in members])


def _head_settings(members: list[Stream], heads: Sequence[HeadSpec], slots: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Per head: each epoch's lr (cosine to 0, then 0), weight decay, momentum, LARC."""
    n_streams = len(members)
    max_epochs = max(heads[i].config.epochs for s in members for i in s.heads)
    lr_table = torch.zeros(n_streams, max_epochs + 1, slots, dtype=dtype)
    wd = torch.zeros(n_streams, 1, slots, 1, dtype=dtype)
    momentum = torch.zeros(n_streams, 1, slots, 1, dtype=dtype)
    lars = torch.zeros(n_streams, 1, slots, 1, dtype=torch.bool)
    for j, s in enumerate(members):
        for slot, i in enumerate(s.heads):
            cfg = heads[i].config
            for e in range(cfg.epochs):
                lr_table[j, e, slot] = cfg.lr * cosine_factor(e, cfg.epochs)
            wd[j, 0, slot, 0] = cfg.weight_decay
            momentum[j, 0, slot, 0] = cfg.momentum
            lars[j, 0, slot, 0] = cfg.optimizer == "lars"
    return lr_table, wd, momentum, lars


def new_epoch(group: Group, j: int, bank_y: torch.Tensor) -> None:
    """Lay out stream ``j``'s permutation of the epoch as ``[steps, B]`` rows and labels."""
    s = group.streams[j]
    order = torch.randperm(s.n, generator=group.generators[j])
    # a standardized stream reads its own copy of its rows, a raw one the feature tensor
    rows = order + s.offset if s.standardize else torch.as_tensor(s.rows)[order]
    pad = s.steps_per_epoch * s.batch_size - s.n
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad)])
    rows = rows.view(s.steps_per_epoch, s.batch_size).to(group.idx.device)
    group.idx[j, :s.steps_per_epoch] = rows
    group.labels[j, :s.steps_per_epoch] = bank_y[rows]


@torch.no_grad()
def train_group(group: Group, bank: torch.Tensor, bank_y: torch.Tensor,
                end_of_epoch: Callable[[int, int], None], trace: Counter | None = None) -> None:
    """Train the group to the end of its longest stream, calling ``end_of_epoch(j, epochs_done)``
    after each epoch of stream ``j``; finished streams (a suffix) leave the batch."""
    steps_per_epoch = [s.steps_per_epoch for s in group.streams]
    totals = [s.total_steps for s in group.streams]
    views: dict[int, Active] = {}
    for step in range(totals[0]):
        active = sum(1 for t in totals if t > step)
        for j in range(active):
            if step % steps_per_epoch[j] == 0:
                new_epoch(group, j, bank_y)
        if active not in views:
            views[active] = Active.of(group, active)
        train_step(views[active], step, bank, trace)
        for j in range(active):
            if (step + 1) % steps_per_epoch[j] == 0:
                end_of_epoch(j, (step + 1) // steps_per_epoch[j])


@dataclass
class Active:
    """A group's tensors for its first ``active`` streams (views, made once per count)."""

    group: Group
    active: int
    uniform: bool              # the streams have the same steps per epoch
    params: torch.Tensor       # [A, D + 1, slots * C], and its views:
    weight_t: torch.Tensor     # [A, slots * C, D]
    bias_t: torch.Tensor       # [A, slots * C, 1]
    grad: torch.Tensor
    grad_w: torch.Tensor       # [A, D, slots * C] (the gradient's rows of the weights)
    grad_b: torch.Tensor       # [A, slots * C]
    buf: torch.Tensor
    wd: torch.Tensor
    momentum: torch.Tensor
    heads4: tuple[int, int, int, int]

    @classmethod
    def of(cls, group: Group, active: int) -> Active:
        dim = group.params.shape[1] - 1
        params, grad = group.params[:active], group.grad[:active]
        spe = [s.steps_per_epoch for s in group.streams[:active]]
        return cls(group=group, active=active, uniform=min(spe) == max(spe), params=params,
                   weight_t=params[:, :dim].transpose(1, 2),
                   bias_t=params[:, dim:].transpose(1, 2), grad=grad, grad_w=grad[:, :dim],
                   grad_b=grad[:, dim], buf=group.buf[:active], wd=group.wd[:active],
                   momentum=group.momentum[:active],
                   heads4=(active, 1, group.slots, group.classes))


def train_step(v: Active, step: int, bank: torch.Tensor, trace: Counter | None = None) -> None:
    """One step of the group's first ``v.active`` streams (finished heads: lr 0)."""
    group, active = v.group, v.active
    dim = bank.shape[1]
    slots, batch, classes = group.slots, group.batch_size, group.classes
    if v.uniform:  # the streams are at the same step of their epochs: views
        spe = group.streams[0].steps_per_epoch
        in_epoch, epoch = step % spe, step // spe
        idx, yb = group.idx[:active, in_epoch], group.labels[:active, in_epoch]
        row_w, lr = group.row_w[:active, in_epoch], group.lr_table[:active, epoch]
    else:
        ar = torch.arange(active, device=bank.device)
        in_epoch = step % group.steps_per_epoch[:active]
        epoch = step // group.steps_per_epoch[:active]
        idx, yb = group.idx[ar, in_epoch], group.labels[ar, in_epoch]  # [A, B]
        row_w, lr = group.row_w[ar, in_epoch], group.lr_table[ar, epoch]
    xb = bank.index_select(0, idx.reshape(-1)).view(active, batch, dim)
    forward_backward(v, xb, yb, row_w)
    if trace is not None:
        trace[("train", active, batch, dim, slots * classes)] += 1
    lr = lr.view(active, 1, slots * classes)   # 0 once a head is done
    if not group.any_lars:  # elementwise: weights and biases in one [A, D + 1, slots * C]
        update(v.params, v.grad, v.buf, lr, v.wd, v.momentum, None)
        return
    heads4 = v.heads4  # LARC's norms are per head and per parameter
    settings = (lr.view(heads4), v.wd.view(heads4), v.momentum.view(heads4),
                group.lars[:active])
    for rows in (slice(0, dim), slice(dim, dim + 1)):  # the weights, then the biases
        update(*(t[:, rows].view(active, -1, slots, classes) for t in (v.params, v.grad, v.buf)),
               *settings)


_LOG2_E = 1.4426950408889634


def forward_backward(v: Active, xb: torch.Tensor, yb: torch.Tensor, row_w: torch.Tensor) -> None:
    """Write into ``v.grad`` every head's mean cross-entropy gradient ``(softmax - onehot) *
    row_w`` on ``xb [A, B, D]``, ``yb [A, B]``. The logits are ``[A, slots, C, B]`` times
    ``log2 e``: class reductions over contiguous rows, and ``exp2`` (3x ``exp``'s speed)."""
    active, batch, _ = xb.shape
    slots, classes = v.group.slots, v.group.classes
    xt = xb.transpose(1, 2)
    logits = torch.baddbmm(v.bias_t, v.weight_t, xt, beta=_LOG2_E, alpha=_LOG2_E)
    grad = logits.view(active, slots, classes, batch)
    grad.sub_(grad.amax(dim=2, keepdim=True)).exp2_()
    weights = row_w.view(active, 1, 1, batch)
    grad.mul_(weights / grad.sum(dim=2, keepdim=True))       # softmax x row weight
    grad.scatter_add_(2, yb.view(active, 1, 1, batch).expand(active, slots, 1, batch),
                      weights.neg().expand(active, slots, 1, batch))
    grad = grad.view(active, slots * classes, batch)
    torch.bmm(xt, grad.transpose(1, 2), out=v.grad_w)           # [A, D, slots * C]
    torch.sum(grad, dim=2, out=v.grad_b)                        # [A, slots * C]


def update(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: torch.Tensor,
           wd: torch.Tensor, momentum: torch.Tensor, lars: torch.Tensor | None) -> None:
    """SGD with momentum and weight decay in place (``grad`` overwritten), or apex LARC per head
    where ``lars`` (shapes ``[A, R, slots, C]``, settings ``[A, 1, slots, C]``): ``g <- (g +
    wd p) a`` with the trust ratio ``a`` when both norms are non-zero, else ``g``."""
    if lars is not None:
        p_norm = param.pow(2).sum(dim=(1, 3), keepdim=True).sqrt()
        g_norm = grad.pow(2).sum(dim=(1, 3), keepdim=True).sqrt()
        ok = lars & (p_norm != 0) & (g_norm != 0)
        scale = torch.where(ok, larc_trust_ratio(p_norm, g_norm, wd), torch.ones_like(p_norm))
        wd = torch.where(lars & ~ok, torch.zeros_like(wd), wd)
        grad.addcmul_(param, wd).mul_(scale)
    else:
        grad.addcmul_(param, wd)
    buf.mul_(momentum).add_(grad)
    param.addcmul_(buf, lr, value=-1.0)


def head_weights(group: Group, stream: Stream, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """One head's weight ``[D, C]`` and bias ``[C]``, as numpy copies."""
    j = group.streams.index(stream)
    dim, classes = group.weight.shape[1], group.classes
    w = group.weight[j].view(dim, group.slots, classes)[:, slot]
    b = group.bias[j].view(group.slots, classes)[slot]
    return w.detach().cpu().numpy().copy(), b.detach().cpu().numpy().copy()
