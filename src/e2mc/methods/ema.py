"""Methods with an exponential-moving-average teacher (BYOL, MoCo v3, DINO).

The teacher is a submodule whose parameters need no gradient, so checkpoints, resumes and the
non-finite guard's snapshot hold it. ``teacher_initialized`` (a buffer) is false in a fresh model:
the first forward copies the student in; a checkpoint holding a teacher sets it."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

from e2mc.methods.base import SSLMethod

#: How an EMA teacher's momentum moves over a run.
MOMENTUM_SCHEDULES = ("constant", "cosine")


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """``t <- momentum * t + (1 - momentum) * s`` for every parameter (not the buffers), as the
    official BYOL, MoCo v3 and DINO code does (``ValueError`` for unequal parameter lists)."""
    for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
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
        :meth:`set_run_length` gives). Both are checked by the subclass's ``param_ranges``."""
        self.momentum, self.momentum_schedule = float(momentum), schedule
        self._run: tuple[int, int] | None = None
        self.teacher = nn.ModuleDict({name: copy.deepcopy(getattr(self, name)).requires_grad_(False)
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
