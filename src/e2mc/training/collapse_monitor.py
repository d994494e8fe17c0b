"""The collapse warning during training: :class:`CollapseMonitor` checks the signals of
:mod:`e2mc.diagnostics.collapse` (the base loss pinned at its collapse value, the effective rank
of the embeddings below its threshold) and warns once per run, naming the signal."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from e2mc.diagnostics.collapse import (
    CollapseSignal,
    collapse_value,
    loss_signal,
    rank_signal,
)
from e2mc.diagnostics.embedding_stats import effective_rank
from e2mc.training.callbacks import Callback

if TYPE_CHECKING:  # pragma: no cover - typing only
    from e2mc.training.callbacks import TrainerView


class CollapseMonitor(Callback):
    """Warns once (stderr and ``collapse/warning``) when the base loss is pinned at its collapse
    value over the last ``window`` steps, or the effective rank on a fixed batch (logged every
    epoch as ``collapse/effective_rank``) falls below the threshold; from ``warmup_steps`` on.
    Never stops the run."""

    name = "collapse"

    def __init__(self, method: str, hparams: Mapping[str, Any] | None = None, window: int = 20,
                 warmup_steps: int | None = None, probe_size: int = 256,
                 stream: Any = None) -> None:
        self.target = collapse_value(method, hparams)
        self.window = window
        self.warmup_steps = warmup_steps
        self.probe_size = probe_size
        self.stream = stream
        self.recent: deque[float] = deque(maxlen=window)
        self.warned: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return {"warned": list(self.warned)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.warned = list(state.get("warned", []))

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int,
                    terms: dict[str, torch.Tensor]) -> str | None:
        steps_per_epoch = trainer.steps_per_epoch
        warmup = self.warmup_steps if self.warmup_steps is not None else steps_per_epoch
        if self.target is not None and self.target.term in terms and not self.warned:
            self.recent.append(float(terms[self.target.term].detach().float().item()))
            if step > warmup:
                found = loss_signal(list(self.recent), self.target, self.window)
                if found is not None:
                    self._warn(trainer, step, found)
        if steps_per_epoch and step % steps_per_epoch == 0 and step > warmup:
            found = self._rank(trainer, step)  # measured and logged at every check
            if found is not None and not self.warned:
                self._warn(trainer, step, found)
        return None

    def _rank(self, trainer: TrainerView, step: int) -> CollapseSignal | None:
        """Effective rank of the first view's embeddings on a fixed batch (eval mode, no grad)."""
        model = trainer.method
        if min(self.probe_size, len(trainer.loader.dataset)) < 2:
            return None
        views = trainer.fixed_views(self.probe_size)  # the training path: any pipeline
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model(views)
        finally:
            model.train(was_training)
        embeddings = out.embeddings[0].float()
        rank = effective_rank(embeddings.cpu())
        if trainer.runtime.is_main:
            trainer.log(step, {"collapse/effective_rank": rank})
        return rank_signal(embeddings, rank=rank)

    def _warn(self, trainer: TrainerView, step: int, signal: CollapseSignal) -> None:
        self.warned.append(signal.kind)
        if not trainer.runtime.is_main:
            return
        print(f"warning: possible collapse at step {step} ({signal.kind} signal): "
              f"{signal.message}", file=self.stream or sys.stderr, flush=True)
        trainer.log(step, {"collapse/warning": 1.0, f"collapse/{signal.kind}": signal.value,
                           "collapse/threshold": signal.threshold})

