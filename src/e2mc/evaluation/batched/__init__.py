"""The package's one linear-probe engine on cached features: many probes (*heads*) trained at
once, each exactly the sequential probe for its settings and seed (``tests/reference.py``).
:mod:`.plan` groups heads that share a matrix product, :mod:`.engine` trains a group (the
gradient written out: autograd took 1.6-1.7x the time), :mod:`.scoring` scores the heads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch

from e2mc.evaluation.batched.engine import build_bank, build_group, train_group
from e2mc.evaluation.batched.plan import HeadSpec, plan_groups, plan_streams
from e2mc.evaluation.batched.scoring import (
    BEST_HEAD_RULE,
    EVAL_CACHE_ELEMENTS,
    best_head,
    evaluate_stream,
    head_results,
    new_trackers,
    prepare_eval_rows,
)
from e2mc.evaluation.linear import ProbeResult

__all__ = ["BEST_HEAD_RULE", "EVAL_CACHE_ELEMENTS", "HeadSpec", "best_head",
           "train_linear_heads"]


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
    """Train every head at once; one :class:`ProbeResult` per head, in order. ``trace`` counts
    the shapes of every matrix product."""
    if not heads:
        raise ValueError("no heads to train")
    device = torch.device(device)
    x_all = torch.as_tensor(train_x, device=device).to(dtype)
    y_all = torch.as_tensor(np.asarray(train_y), device=device).long()
    ex_all = torch.as_tensor(eval_x, device=device).to(dtype)
    ey_all = torch.as_tensor(np.asarray(eval_y), device=device).long()
    _check_inputs(x_all, y_all, ex_all, ey_all, heads)
    dim = x_all.shape[1]
    classes = num_classes or int(max(y_all.max().item(), ey_all.max().item())) + 1

    streams, head_slots = plan_streams(heads)
    bank, bank_y = build_bank(x_all, y_all, streams)
    prepare_eval_rows(streams, ex_all)
    groups = [build_group(members, heads, dim, classes, device, dtype)
              for members in plan_groups(streams)]
    records = new_trackers(heads, ey_all)
    for group in groups:
        score = partial(evaluate_stream, group, heads=heads, ex_all=ex_all, ey_all=ey_all,
                        records=records, chunk=eval_chunk, trace=trace)
        train_group(group, bank, bank_y, score, trace)
    return head_results(records, groups, head_slots) if keep_weights else head_results(records)


def _check_inputs(x_all: torch.Tensor, y_all: torch.Tensor, ex_all: torch.Tensor,
                  ey_all: torch.Tensor, heads: Sequence[HeadSpec]) -> None:
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
