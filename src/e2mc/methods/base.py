"""The interface every SSL method implements; the trainer relies on nothing else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from e2mc.ranges import Bound, checked

CompactSpace = Literal["hypercube", "hypersphere"]
#: The view recipes of ``e2mc.data.build_views`` (``e2mc.data.views.RECIPES``; a test keeps the
#: two equal): the names a method's ``view_recipe`` may take.
VIEW_RECIPES = ("vicreg", "swav", "simsiam")


@dataclass
class MethodOutput:
    """One forward pass: ``loss`` (differentiable), ``terms`` (named, detached, for logging),
    ``embeddings`` (the add-on inputs of the two main views, ``[n, d]``, not detached) and
    ``all_embeddings`` (every view's, MMCR uses them; defaults to ``embeddings``)."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]
    embeddings: list[torch.Tensor]
    all_embeddings: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.all_embeddings:
            self.all_embeddings = list(self.embeddings)


@dataclass(frozen=True)
class CollapseValue:
    """The value of the base term ``term`` on a collapsed model (every image the same
    embedding), how close counts as pinned, and why in words."""

    term: str
    value: float
    tolerance: float
    meaning: str


class SSLMethod(nn.Module):
    """Base class of every method: subclasses set ``name``, ``view_recipe`` and
    ``compact_space`` (the E2MC transform that suits their embeddings), hold ``backbone`` (with
    official layer names, so official weights load strictly) and ``feature_dim``, and implement
    :meth:`forward` and :meth:`build_optimizer`."""

    name: str = "base"
    view_recipe: str = "vicreg"
    compact_space: CompactSpace = "hypercube"
    #: True when the method uses SyncBatchNorm under DDP (all three official methods do).
    sync_batchnorm: bool = True

    backbone: nn.Module
    feature_dim: int
    hparams: dict[str, Any]

    collapse: CollapseValue | None = None  # the base loss on a collapsed model, if known

    #: The range of every constructor parameter but the flags and the backbone's (checked by the
    #: configuration before anything is built, and on every construction).
    param_ranges: ClassVar[dict[str, Bound]] = {}
    #: The same for :meth:`build_optimizer`'s options (``optim.params``).
    optimizer_ranges: ClassVar[dict[str, Bound]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, table in (("__init__", "param_ranges"), ("build_optimizer", "optimizer_ranges")):
            if name in vars(cls):
                keep = "_arguments" if name == "__init__" else None
                setattr(cls, name, checked(vars(cls)[name], table, skip=nn.Module, keep=keep))

    def record_hparams(self, backbone: dict[str, Any], **resolved: Any) -> None:
        """``self.hparams``, what rebuilds the model: the constructor's arguments, defaults
        included, with the backbone's as :func:`~e2mc.methods.common.resolve_backbone` gives
        them and ``resolved`` (a default the constructor resolved, a tuple as a list)."""
        given = {k: v for k, v in self.__dict__.pop("_arguments").items()
                 if k not in ("backbone", "small_images", "in_channels", "feature_dim")}
        self.hparams = {**backbone, **given, **resolved}

    @classmethod
    def collapse_value(cls, hparams: Mapping[str, Any] | None = None) -> CollapseValue | None:
        """:attr:`collapse` for ``hparams`` (a checkpoint's; read by e2mc.diagnostics.collapse)."""
        return cls.collapse

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:  # pragma: no cover
        raise NotImplementedError

    def build_optimizer(self, lr: float, weight_decay: float, **kwargs: Any
                        ) -> torch.optim.Optimizer:  # pragma: no cover
        raise NotImplementedError

    # Hooks with no-op defaults; the trainer calls them every step / epoch.
    def set_epoch(self, epoch: int) -> None:
        """Called at the start of every epoch (0-based, counting continued epochs too)."""

    def set_run_length(self, first_iteration: int, iterations: int) -> None:
        """Called once per invocation before its first step: this run's optimisation steps are
        the global iterations ``first_iteration .. first_iteration + iterations - 1`` (for
        schedules over the run, e.g. an EMA teacher's cosine momentum)."""

    def before_step(self, iteration: int) -> None:
        """Called before the forward pass of every optimisation step (global iteration)."""

    def after_backward(self, iteration: int) -> None:
        """Called after ``backward()`` and before ``optimizer.step()``."""

    def after_step(self, iteration: int) -> None:
        """Called after a successful ``optimizer.step()`` (e.g. the EMA update of a teacher)."""

    def training_state(self) -> dict[str, Any]:
        """State outside ``state_dict()`` that a checkpoint must hold (e.g. the SwAV queue)."""
        return {}

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`training_state` returned."""
