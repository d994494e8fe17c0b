"""Methods with an exponential-moving-average teacher (BYOL's target, MoCo v3's momentum
encoder, DINO's teacher).

The teacher is a submodule (``teacher.<part>``) whose parameters do not require gradients, so
it is part of ``state_dict()``: the checkpoint holds it, a resume restores it bit for bit, and the
non-finite guard's snapshot covers it. Its parameters follow the student's after every successful
optimizer step (:meth:`EMAMethod.after_step`); since every process applies the same update to
the same (DDP-synchronised) student weights, the teachers of all processes stay identical.

``teacher_initialized`` (a buffer) is false in a freshly built model: the first training forward
pass copies the student into the teacher. A checkpoint that holds a teacher (the project's, the
official DINO layout) sets it, so a model started from a backbone-only file (``--new-heads``)
gets a teacher equal to its loaded student, and one resumed keeps its own teacher.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

from e2mc.methods.base import SSLMethod

#: How an EMA teacher's momentum moves over a run.
MOMENTUM_SCHEDULES = ("constant", "cosine")


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters do not require gradients."""
    twin = copy.deepcopy(module)
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """``t <- momentum * t + (1 - momentum) * s`` for every parameter (not the buffers), as the
    official BYOL, MoCo v3 and DINO code does."""
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    if len(t_params) != len(s_params):
        raise ValueError("teacher and student have different parameter lists")
    for t, s in zip(t_params, s_params, strict=True):
        t.mul_(momentum).add_(s.detach().to(t.dtype), alpha=1.0 - momentum)


class EMAMethod(SSLMethod):
    """An :class:`SSLMethod` whose ``teacher`` (a ``ModuleDict``) follows the student parts named
    in :attr:`student_parts` with EMA momentum ``self.momentum``."""

    student_parts: tuple[str, ...] = ("backbone",)
    momentum: float
    teacher: nn.ModuleDict

    def init_teacher(self, momentum: float, schedule: str = "constant") -> None:
        """Create the teacher as frozen copies of the student parts (call once, at the end of
        ``__init__``). ``schedule``: ``constant`` (``momentum`` at every step) or ``cosine``
        (the official BYOL, MoCo v3 and DINO runs: from ``momentum`` at the run's first step to
        1 at its end, ``1 - (1 - momentum) (cos(pi t / T) + 1) / 2``, over the run's steps
        :meth:`set_run_length` gives)."""
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"the EMA momentum must be in [0, 1], got {momentum}")
        if schedule not in MOMENTUM_SCHEDULES:
            raise ValueError(f"momentum_schedule must be one of {', '.join(MOMENTUM_SCHEDULES)}, "
                             f"got {schedule!r}")
        self.momentum, self.momentum_schedule = float(momentum), schedule
        self._run: tuple[int, int] | None = None
        self.teacher = nn.ModuleDict({name: frozen_copy(getattr(self, name))
                                      for name in self.student_parts})
        self.register_buffer("teacher_initialized", torch.tensor(False))

    def _student(self) -> nn.ModuleDict:
        return nn.ModuleDict({name: getattr(self, name) for name in self.student_parts})

    @torch.no_grad()
    def ensure_teacher(self) -> None:
        """Copy the student into the teacher if the teacher was never set (see the module doc)."""
        if bool(self.teacher_initialized):
            return
        self.teacher.load_state_dict(self._student().state_dict())
        self.teacher_initialized.fill_(True)

    def set_run_length(self, first_iteration: int, iterations: int) -> None:
        self._run = (first_iteration, iterations)

    def momentum_at(self, iteration: int) -> float:
        """The EMA momentum of the update after ``iteration`` (:meth:`init_teacher`)."""
        if self.momentum_schedule == "constant" or self._run is None:
            return self.momentum
        first, total = self._run
        progress = min(max((iteration - first) / max(total, 1), 0.0), 1.0)
        return 1.0 - (1.0 - self.momentum) * (math.cos(math.pi * progress) + 1.0) / 2.0

    def after_step(self, iteration: int) -> None:
        """The EMA update of the teacher with the weights the optimizer step just wrote."""
        self.ensure_teacher()
        ema_update(self.teacher, self._student(), self.momentum_at(iteration))

    def online_and_target(self, views: Sequence[torch.Tensor]
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """For the two views: the student's projections ``z`` (what E2MC acts on), their
        predictions ``p`` (``predictor`` after ``projector``) and the teacher's projections
        ``t`` (no gradient): BYOL's online and target networks, MoCo v3's queries and keys."""
        self.ensure_teacher()
        z = [self.projector(self.backbone(v)) for v in views[:2]]
        p = [self.predictor(zi) for zi in z]
        with torch.no_grad():
            t = [self.teacher["projector"](self.teacher["backbone"](v)) for v in views[:2]]
        return z, p, t
