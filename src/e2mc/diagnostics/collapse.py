"""Collapse signals of a run (docs/diagnostics.md): the base loss pinned at its
collapse value (:func:`loss_signal`), an effective rank below a threshold (:func:`rank_signal`),
features at chance (:func:`chance_signal`). Pure functions of numbers the run already has; used
by :class:`e2mc.training.collapse_monitor.CollapseMonitor` and ``e2mc analyze``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from e2mc.artifacts import read_jsonl
from e2mc.diagnostics.embedding_stats import effective_rank
from e2mc.evaluation.sanity import chance_level, near_chance
from e2mc.methods import METHODS
from e2mc.methods.base import CollapseValue


@dataclass(frozen=True)
class CollapseSignal:
    """One fired signal: ``kind`` is ``"loss"``, ``"rank"`` or ``"chance"``; ``message`` names
    it."""

    kind: str
    message: str
    value: float
    threshold: float


def collapse_value(method: str, hparams: Mapping[str, Any] | None = None
                   ) -> CollapseValue | None:
    """The collapse value of the method named ``method`` with ``hparams``
    (:meth:`e2mc.methods.SSLMethod.collapse_value`; ``None`` for a method without one)."""
    cls = METHODS.get(method)
    return cls.collapse_value(hparams) if cls is not None else None


def loss_signal(losses: Sequence[float], target: CollapseValue, window: int
                ) -> CollapseSignal | None:
    """The loss signal when each of the last ``window`` values of the base term is within
    ``target.tolerance`` of its collapse value (``None`` otherwise, or with fewer values)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    tail = [float(v) for v in losses[-window:]]
    if len(tail) < window or not all(math.isfinite(v) for v in tail):
        return None
    gap = max(abs(v - target.value) for v in tail)
    if gap > target.tolerance:
        return None
    mean = sum(tail) / len(tail)
    return CollapseSignal(
        "loss", f"{target.term} has stayed at {mean:.4f} for the last {window} logged steps, "
                f"within {target.tolerance:.3g} of its collapse value {target.meaning}",
        mean, target.value)


def rank_signal(embeddings: torch.Tensor, min_rank: float = 2.0, rank_fraction: float = 0.01,
                rank: float | None = None) -> CollapseSignal | None:
    """The rank signal when the effective rank of the projector ``embeddings`` (``[n, d]``,
    ``n >= 2``) is below ``max(min_rank, rank_fraction * dim)``; ``rank``: that rank, where the
    caller has computed it."""
    if embeddings.ndim != 2 or embeddings.shape[0] < 2:
        raise ValueError(f"need [n >= 2, d] embeddings, got shape {tuple(embeddings.shape)}")
    threshold = max(min_rank, rank_fraction * embeddings.shape[1])
    if rank is None:
        rank = effective_rank(embeddings.detach().float().cpu())
    if rank >= threshold:
        return None
    return CollapseSignal(
        "rank", f"the effective rank of the projector embeddings is {rank:.2f} of "
                f"{embeddings.shape[1]} dimensions, below {threshold:.3g}", rank, threshold)


def read_term(metrics: str | Path, term: str) -> list[float]:
    """The logged values of ``term`` in a ``metrics.jsonl``, in order (records without it, e.g.
    evaluation records, are skipped; so is a last line cut by a kill)."""
    return [float(r[term]) for r in read_jsonl(metrics, partial_last_line=True)
            if r.get(term) is not None]


def check_run(method: str, hparams: Mapping[str, Any] | None, losses: Sequence[float] | None,
              embeddings: torch.Tensor | None, window: int = 20) -> list[CollapseSignal]:
    """Every signal that fires for a run: its base term's logged values (``losses``, may be
    ``None``; the loss signal needs at least ``window`` of them) and its embeddings on some
    images (may be ``None``)."""
    target = collapse_value(method, hparams)
    signals = [loss_signal(losses, target, window) if target is not None and losses else None,
               rank_signal(embeddings)
               if embeddings is not None and embeddings.shape[0] >= 2 else None]
    return [s for s in signals if s is not None]


def leave_one_out_top1(labels: torch.Tensor, neighbors: torch.Tensor) -> float:
    """Top-1 (%) of each row's majority label among its neighbours (``neighbors``: ``[n, k]``
    row indices, e.g. of :func:`~e2mc.diagnostics.embedding_stats.nearest_neighbors`; ties to
    the smallest label)."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    votes = torch.zeros(len(labels), int(labels.max()) + 1, dtype=torch.long)
    votes.scatter_add_(1, labels[neighbors], torch.ones_like(neighbors))
    return 100.0 * float((votes.argmax(1) == labels).double().mean())


def chance_signal(labels: torch.Tensor, neighbors: torch.Tensor) -> CollapseSignal | None:
    """The chance signal when :func:`leave_one_out_top1` is at or near chance, the most common
    label's share (``None`` otherwise, or with a single class)."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    chance = chance_level(labels.numpy())
    if chance is None:
        return None
    top1 = leave_one_out_top1(labels, neighbors)
    if not near_chance(top1, chance):
        return None
    return CollapseSignal(
        "chance", f"the kNN top-1 of the features within the {len(labels)} analysed images "
                  f"(each one's majority class among its {neighbors.shape[1]} nearest others) "
                  f"is {top1:.2f} %, at or near chance ({chance:.2f} %, the most common "
                  "class's share): the features hold next to nothing of the labels",
        top1, chance)
