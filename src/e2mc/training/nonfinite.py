"""The non-finite guard: a loss term, gradient or weight that is NaN, infinite or past
:data:`EXPLODED` is named and agreed on by every process; a checkpoint of such weights is
refused; with ``--skip-nonfinite`` a failed step is undone from a snapshot."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from e2mc.distributed import Runtime
from e2mc.errors import NonFiniteError


class NonFiniteLossError(NonFiniteError):
    """A loss term, gradient or weight became non-finite or exploded; the message names it."""


#: A parameter whose magnitude passes this after an update counts as exploded (a learning-rate
#: blow-up): it is treated like a non-finite value and never checkpointed.
EXPLODED = 1e8


def _max_abs(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``max |t|`` of every tensor (NaN where a tensor holds a NaN), as one float32 vector."""
    if not tensors:
        return torch.zeros(0)
    return torch.stack([t.detach().abs().amax().float() if t.numel()
                        else torch.zeros((), device=t.device) for t in tensors]).cpu()


class NonFiniteGuard:
    """The non-finite checks of a trainer's ``method`` (collective under DDP), the snapshot and
    restore of a step, and the last good checkpoint the messages name."""

    def __init__(self, method: nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, runtime: Runtime) -> None:
        self.method, self.optimizer, self.scaler, self.runtime = method, optimizer, scaler, runtime
        self.last_good: tuple[Path, int] | None = None  # (checkpoint, step) for messages

    def last_good_text(self) -> str:
        if self.last_good is None:
            return "No checkpoint was written yet"
        path, step = self.last_good
        return f"The last good checkpoint is {path} (step {step})"

    def refuse_bad_weights(self, step: int, agree: bool = True) -> None:
        """Never checkpoint a non-finite or exploded state (``agree``: a collective call)."""
        bad = self.weights_problem(agree)
        if bad is not None:
            raise NonFiniteLossError(f"{bad} at step {step}; not writing a checkpoint. "
                                     f"{self.last_good_text()}")

    def _first_bad(self, names: list[str], finite: torch.Tensor, elsewhere: str) -> str | None:
        """The first of ``names`` whose ``finite`` is False, agreed over all processes
        (``elsewhere`` when only another process has one); None when there is none."""
        if not self._agree(not bool(finite.all())):
            return None
        return next((n for n, ok in zip(names, finite.tolist(), strict=True) if not ok),
                    elsewhere)

    def first_nonfinite(self, terms: dict[str, torch.Tensor]) -> str | None:
        """Name of the first non-finite term, agreed over all processes."""
        values = torch.stack([t.detach().float().reshape(()) for t in terms.values()])
        return self._first_bad(list(terms), torch.isfinite(values), "a term on another process")

    def _agree(self, flag: bool) -> bool:
        """``flag`` of any process (all processes take the same decision)."""
        if not self.runtime.distributed:
            return flag
        t = torch.tensor([int(flag)], device=self.runtime.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def nonfinite_gradient(self) -> str | None:
        """``"the gradient of NAME is not finite"`` for the first such parameter, else None."""
        named = [(n, p.grad) for n, p in self.method.named_parameters() if p.grad is not None]
        finite = torch.isfinite(_max_abs([g for _, g in named]))
        bad = self._first_bad([n for n, _ in named], finite, "a parameter on another process")
        return None if bad is None else f"the gradient of {bad} is not finite"

    def weights_problem(self, agree: bool = True) -> str | None:
        """A non-finite parameter or buffer, or a parameter past :data:`EXPLODED`, else None."""
        params = list(self.method.named_parameters())
        buffers = [(n, b) for n, b in self.method.named_buffers() if b.is_floating_point()]
        peaks = _max_abs([t for _, t in params + buffers])
        limits = torch.tensor([EXPLODED] * len(params) + [math.inf] * len(buffers))
        ok = torch.isfinite(peaks) & (peaks <= limits)
        failed = not bool(ok.all())
        if not (self._agree(failed) if agree else failed):
            return None
        names = [n for n, _ in params + buffers]
        for i, good in enumerate(ok.tolist()):
            if not good:
                value = float(peaks[i])
                if math.isfinite(value):
                    return (f"the weights exploded ({names[i]} reached {value:.3g} > "
                            f"{EXPLODED:g}; learning rate too high?)")
                return f"{names[i]} is not finite after the update"
        return "a weight on another process is not finite"

    def snapshot(self) -> dict[str, Any]:
        """The weights, buffers and optimizer state before a step (``--skip-nonfinite``)."""
        return {"model": {k: v.detach().clone() for k, v in self.method.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "scaler": self.scaler.state_dict()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.method.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
