"""Collapse signals of a self-supervised run: is the base loss pinned at the value a collapsed
model gets, or have the embeddings lost all but one or two directions?

Two signals, both pure functions of numbers the run already has:

* **loss pinned at its collapse value** (:func:`loss_signal`): the method's base term stays within
  a tolerance of the value it takes when every image gets the same embedding, over a window of
  logged steps:

  - SwAV ``base/swav`` at ``ln K`` (``K`` prototypes): the cross-entropy against a uniform
    prediction, whatever the Sinkhorn targets; a collapsed model predicts uniformly;
  - VICReg ``base/variance`` at ``1 - sqrt(1e-4) = 0.99``: the hinge on the standard deviation
    when every dimension is constant over the batch (the variance floor);
  - SimSiam ``base/negative_cosine`` at ``-1``: the two views' predictions and projections
    coincide, which a constant output gets for free.

* **effective rank below a threshold** (:func:`rank_signal`): the effective rank
  (:func:`e2mc.diagnostics.statistics.effective_rank`) of the embeddings of a batch is below
  ``max(min_rank, rank_fraction * dim)`` (defaults 2 and 1%): a constant output has rank 0, a
  rank-one output 1.

:class:`CollapseMonitor` is the training callback (``e2mc pretrain`` / ``e2mc continue``): it
checks both signals and warns once per run, naming the signal. ``e2mc analyze`` runs the same
checks on a finished run (:func:`check_run`).
"""

from __future__ import annotations

import json
import math
import sys
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from e2mc.diagnostics.statistics import effective_rank
from e2mc.training.callbacks import Callback

if TYPE_CHECKING:  # pragma: no cover - typing only
    from e2mc.training.trainer import Trainer

#: VICReg's ``std = sqrt(var + 1e-4)``: the variance hinge of a constant dimension.
VICREG_VARIANCE_FLOOR = 1.0 - math.sqrt(1e-4)


@dataclass(frozen=True)
class CollapseValue:
    """The logged term (trainer name) of a method and the value it takes on a collapsed model;
    ``tolerance``: how close counts as pinned."""

    term: str
    value: float
    tolerance: float
    meaning: str


@dataclass(frozen=True)
class CollapseSignal:
    """One fired signal: ``kind`` is ``"loss"`` or ``"rank"``; ``message`` names it."""

    kind: str
    message: str
    value: float
    threshold: float

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "value": self.value,
                "threshold": self.threshold}


def collapse_value(method: str, hparams: Mapping[str, Any] | None = None
                   ) -> CollapseValue | None:
    """The collapse value of ``method``'s base term (``None`` for a method without one).

    Tolerances: 2% of ``ln K`` for SwAV (a learning run ends well below, e.g. 3.3 against
    ln 100 = 4.61), 0.05 for VICReg's variance hinge (a learning run keeps it near 0), 0.01 for
    SimSiam's cosine."""
    hparams = dict(hparams or {})
    if method == "swav":
        k = int(hparams.get("n_prototypes", 3000))
        ln_k = math.log(k)
        return CollapseValue("base/swav", ln_k, 0.02 * ln_k,
                             f"ln K = ln {k} = {ln_k:.3f}, the loss of a uniform prediction")
    if method == "vicreg":
        return CollapseValue("base/variance", VICREG_VARIANCE_FLOOR, 0.05,
                             f"the variance floor {VICREG_VARIANCE_FLOOR:.2f} (every dimension "
                             "constant over the batch)")
    if method == "simsiam":
        return CollapseValue("base/negative_cosine", -1.0, 0.01,
                             "-1, the negative cosine of identical outputs")
    return None


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


def rank_threshold(dim: int, min_rank: float = 2.0, rank_fraction: float = 0.01) -> float:
    """``max(min_rank, rank_fraction * dim)``: 2 for up to 200 dimensions."""
    return max(min_rank, rank_fraction * dim)


def rank_signal(embeddings: torch.Tensor, min_rank: float = 2.0, rank_fraction: float = 0.01,
                what: str = "embeddings") -> CollapseSignal | None:
    """The rank signal when the effective rank of ``embeddings`` (``[n, d]``, ``n >= 2``) is
    below :func:`rank_threshold`."""
    if embeddings.ndim != 2 or embeddings.shape[0] < 2:
        raise ValueError(f"need [n >= 2, d] embeddings, got shape {tuple(embeddings.shape)}")
    threshold = rank_threshold(embeddings.shape[1], min_rank, rank_fraction)
    rank = effective_rank(embeddings.detach().float().cpu())
    if rank >= threshold:
        return None
    return CollapseSignal(
        "rank", f"the effective rank of the {what} is {rank:.2f} of {embeddings.shape[1]} "
                f"dimensions, below {threshold:.3g}", rank, threshold)


def read_term(metrics: str | Path, term: str) -> list[float]:
    """The logged values of ``term`` in a ``metrics.jsonl``, in order (records without it, e.g.
    evaluation records, are skipped)."""
    values = []
    for line in Path(metrics).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if term in record and record[term] is not None:
            values.append(float(record[term]))
    return values


def check_run(method: str, hparams: Mapping[str, Any] | None, losses: Sequence[float] | None,
              embeddings: torch.Tensor | None, window: int = 20, min_rank: float = 2.0,
              rank_fraction: float = 0.01) -> list[CollapseSignal]:
    """Every signal that fires for a run: its base term's logged values (``losses``, may be
    ``None``; the loss signal needs at least ``window`` of them) and its embeddings on some
    images (may be ``None``)."""
    signals = []
    target = collapse_value(method, hparams)
    if target is not None and losses:
        found = loss_signal(losses, target, window)  # None with fewer than `window` values
        if found is not None:
            signals.append(found)
    if embeddings is not None and embeddings.shape[0] >= 2:
        found = rank_signal(embeddings, min_rank, rank_fraction, "projector embeddings")
        if found is not None:
            signals.append(found)
    return signals


class CollapseMonitor(Callback):
    """Training callback: warn once (stderr and a ``collapse/warning`` record in
    ``metrics.jsonl``) when the base loss is pinned at its collapse value over the last
    ``window`` steps, or when the effective rank of the embeddings of the current model on a
    fixed batch falls below the threshold (checked at the end of every epoch). Starts checking
    after ``warmup_steps`` (a learning SwAV run starts near ``ln K`` too). Never stops the run.
    """

    name = "collapse"

    def __init__(self, method: str, hparams: Mapping[str, Any] | None = None, window: int = 20,
                 warmup_steps: int | None = None, min_rank: float = 2.0,
                 rank_fraction: float = 0.01, probe_size: int = 256,
                 stream: Any = None) -> None:
        self.target = collapse_value(method, hparams)
        self.window = window
        self.warmup_steps = warmup_steps
        self.min_rank, self.rank_fraction = min_rank, rank_fraction
        self.probe_size = probe_size
        self.stream = stream
        self.recent: deque[float] = deque(maxlen=window)
        self.warned: list[str] = []

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"warned": list(self.warned)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.warned = list(state.get("warned", []))

    # -- hooks -------------------------------------------------------------------------------
    def on_step_end(self, trainer: Trainer, step: int, run_epoch: int,
                    terms: dict[str, torch.Tensor]) -> str | None:
        if self.warned:
            return None
        spe = int(getattr(trainer, "steps_per_epoch", 0) or 0)
        warmup = self.warmup_steps if self.warmup_steps is not None else spe
        if self.target is not None and self.target.term in terms:
            self.recent.append(float(terms[self.target.term].detach().float().item()))
            if step > warmup:
                found = loss_signal(list(self.recent), self.target, self.window)
                if found is not None:
                    self._warn(trainer, step, found)
                    return None
        if spe and step % spe == 0 and step > warmup:
            found = self._rank(trainer)
            if found is not None:
                self._warn(trainer, step, found)
        return None

    def _rank(self, trainer: Trainer) -> CollapseSignal | None:
        """Effective rank of the first view's embeddings on the dataset's first
        ``probe_size`` images (their views seeded by the index, so the batch is the same at
        every check and the training's random streams are untouched), in eval mode without
        gradients (no method state changes)."""
        model = trainer.method
        dataset = trainer.loader.dataset  # SeededSamples: item (index, seed), RNG untouched
        n = min(self.probe_size, len(dataset))
        if n < 2:
            return None
        views = _stack_views(dataset[(i, i)] for i in range(n))
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model([v.to(device) for v in views])
        finally:
            model.train(was_training)
        return rank_signal(out.embeddings[0].float(), self.min_rank, self.rank_fraction,
                           "projector embeddings")

    def _warn(self, trainer: Trainer, step: int, signal: CollapseSignal) -> None:
        self.warned.append(signal.kind)
        if not getattr(getattr(trainer, "rt", None), "is_main", True):
            return
        text = (f"warning: possible collapse at step {step} ({signal.kind} signal): "
                f"{signal.message}")
        print(text, file=self.stream or sys.stderr, flush=True)
        log = getattr(trainer, "log", None)
        if callable(log):
            log(step, {"collapse/warning": 1.0, f"collapse/{signal.kind}": signal.value,
                       "collapse/threshold": signal.threshold})


def _stack_views(items: Iterable[Any]) -> list[torch.Tensor]:
    """Dataset items (``(views, label)`` or ``views``) -> one batch tensor per view."""
    per_view: list[list[torch.Tensor]] = []
    for item in items:
        views = item[0] if isinstance(item, tuple) else item
        if not per_view:
            per_view = [[] for _ in views]
        for slot, v in zip(per_view, views, strict=True):
            slot.append(v)
    return [torch.stack(v) for v in per_view]
