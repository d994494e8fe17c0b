"""The run configuration's schema: the dataclasses of :class:`RunConfig`, each section with the
ranges of its keys (``RANGES``, :mod:`e2mc.ranges`), and :meth:`RunConfig.validate`."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from e2mc.config.fields import check_distinct, check_params, resolve_metric, resolve_signals
from e2mc.ranges import Bound, OneOf, above, at_least, between, check_values

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SCHEDULES = ("constant", "cosine")
LR_SCALINGS = ("none", "linear")
PIPELINES = ("auto", "pil", "fast", "device")
MODES = ("continue", "pretrain")


@dataclass
class ModelConfig:
    """The backbone (``e2mc.models.build_backbone``) by name: ``resnet50``,
    ``torchvision:resnet50[:WEIGHTS]``, ``timm:NAME``, ``hf:REPO_ID``, ``cnn5_small``.
    ``in_channels`` None: ``data.channels``."""

    backbone: str = "resnet50"
    small_images: bool = False
    in_channels: int | None = 3


@dataclass
class MethodConfig:
    """The SSL method (``e2mc.methods.build_method(name, **params)``)."""

    name: str = "vicreg"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class AddonConfig:
    """The add-on criterion (``e2mc.addons.build_addon(name, **params)``); ``none`` = continued.
    For ``e2mc`` the trainer fills ``space`` and ``batch_size_for_cov`` unless given here."""

    name: str = "none"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """Learning rate and schedule; the optimizer itself is the method's preset.
    ``lr = base_lr * batch_size / 256`` with ``lr_scaling: linear``, ``base_lr`` with ``none``;
    ``cosine`` has a linear warm-up; ``fix_lr`` groups (SimSiam's predictor) keep their rate.
    ``weight_decay_end``: a cosine from ``weight_decay`` to it over the run (None: constant)."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "base_lr": above(0), "lr_scaling": OneOf(LR_SCALINGS), "weight_decay": at_least(0),
        "schedule": OneOf(SCHEDULES), "warmup_epochs": at_least(0),
        "final_lr_fraction": between(0, 1), "weight_decay_end": at_least(0)}

    base_lr: float = 0.003
    lr_scaling: str = "linear"
    weight_decay: float = 1e-6
    schedule: str = "constant"
    warmup_epochs: float = 0.0
    final_lr_fraction: float = 0.0
    weight_decay_end: float | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """Training images and their views (``e2mc.data.build_dataset`` / ``build_views``).
    ``recipe``: default the method's. ``limit`` keeps the first N images. ``val_split`` (a fraction
    in (0, 1) or a count >= 1, stratified, drawn with ``val_seed``) is never trained on.
    ``pipeline``: ``pil``, ``fast`` or ``device`` (docs/training.md); ``auto`` and the ``None``
    defaults are chosen by :mod:`e2mc.training.hardware` and :mod:`e2mc.training.fit`."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "image_size": at_least(1), "channels": at_least(1), "num_workers": at_least(0),
        "limit": at_least(1), "pipeline": OneOf(PIPELINES)}

    dataset: str | None = None
    split: str = "train"
    image_size: int | None = 224
    channels: int | None = 3
    recipe: str | None = None
    num_workers: int | None = None
    skip_corrupt: bool = False
    limit: int | None = None
    val_split: float | None = None
    val_seed: int = 0
    pipeline: str = "auto"


@dataclass
class InitConfig:
    """Where a ``continue`` run starts. ``base_epoch``: the base model's epochs (None: read from
    the checkpoint); ``load_optimizer``: resume the checkpoint's optimizer state, keeping this
    run's learning rate; ``checkpoint`` may be a URL (``#sha256=<hex>`` checked); ``new_heads``:
    a backbone-only checkpoint starts the heads from random weights (otherwise an error)."""

    RANGES: ClassVar[dict[str, Bound]] = {"base_epoch": at_least(0)}

    checkpoint: str | None = None
    trust: bool = False
    base_epoch: int | None = None
    load_optimizer: bool = True
    new_heads: bool = False


@dataclass
class LoggingConfig:
    """Metrics besides ``metrics.jsonl``: TensorBoard (null: when installed; true: a note when
    it is not; false: off) and Weights & Biases (``wandb``, ``wandb_mode`` default: wandb's own)."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "wandb_mode": OneOf(("online", "offline", "disabled"))}

    tensorboard: bool | None = None
    wandb: bool = False
    wandb_project: str = "e2mc"
    wandb_entity: str | None = None
    wandb_name: str | None = None
    wandb_mode: str | None = None


@dataclass
class TrainingConfig:
    """The loop. ``batch_size`` is global; ``epochs`` counts this run's epochs; ``max_steps`` stops
    it with a checkpoint; ``preempt_signals`` (``[]``: none) stop after the step with a checkpoint
    and exit 75, and ``requeue`` then runs ``scontrol requeue`` after a time-limit signal
    (``e2mc.training.preemption.SIGNAL_TABLE``). ``precision`` / ``channels_last`` ``auto`` /
    None: :mod:`e2mc.training.hardware`; ``fit_batch``: :mod:`e2mc.training.fit`."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "epochs": at_least(1), "batch_size": at_least(1), "seed": at_least(0),
        "precision": OneOf(PRECISIONS), "log_every": at_least(1),
        "checkpoint_every_steps": at_least(0), "max_steps": at_least(1),
        "cpu_threads": at_least(1)}

    epochs: int = 10
    batch_size: int = 512
    fit_batch: bool = False
    seed: int = 0
    precision: str = "auto"
    device: str = "auto"
    log_every: int = 10
    checkpoint_every_steps: int = 0
    keep_epoch_checkpoints: bool = True
    skip_nonfinite: bool = False
    max_steps: int | None = None
    progress: bool = True
    channels_last: bool | None = None
    find_unused_parameters: bool = False
    cpu_threads: int | None = None
    compile: bool = False
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGHUP"])
    requeue: bool = True


@dataclass
class MonitorConfig:
    """The validation monitor (``e2mc.training.monitor``), on whenever ``data.val_split`` is set:
    at step 0, every ``every`` steps (None: each epoch) and at the end, kNN and linear probes
    (``fractions`` of the *training* set, ``label_seeds``), effective rank and entropy.
    ``keep_best``: a metric whose best step is kept as ``best.pt``; ``patience``: stop after that
    many evaluations without a gain of more than ``min_delta``."""

    RANGES: ClassVar[dict[str, Bound]] = {
        "every": at_least(1), "knn_k": at_least(1), "probe_epochs": at_least(1),
        "batch_size": at_least(1), "patience": at_least(1), "min_delta": at_least(0)}

    enabled: bool = True
    every: int | None = None
    knn_k: int = 20
    fractions: list[float] = field(default_factory=lambda: [0.01, 1.0])
    label_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    probe_epochs: int = 30
    batch_size: int = 256
    keep_best: str | None = None
    patience: int | None = None
    min_delta: float = 0.0


@dataclass
class RunConfig:
    """A whole run; ``mode`` is ``continue`` (the paper's step 2) or ``pretrain``."""

    RANGES: ClassVar[dict[str, Bound]] = {"mode": OneOf(MODES)}

    name: str = "run"
    mode: str = "continue"
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    addon: AddonConfig = field(default_factory=AddonConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    init: InitConfig = field(default_factory=InitConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def validate(self) -> None:
        """What the types cannot check: the ``RANGES``, device, signals, monitor and ``params``."""
        check_values(self.RANGES, vars(self))
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "RANGES"):
                check_values(value.RANGES, vars(value), prefix=f"{section.name}.")
        if self.lr > _FLOAT32_MAX:
            raise ValueError(f"optim.base_lr={self.optim.base_lr:g} gives the learning rate "
                             f"{self.lr:g}, more than float32 can hold (3.4e38)")
        if not _DEVICE.match(self.training.device):
            raise ValueError(f"training.device must be auto, cpu, cuda, cuda:N or mps; got "
                             f"{self.training.device!r}")
        resolve_signals(self.training.preempt_signals)
        self._validate_monitor()
        self._validate_params()

    def _validate_params(self) -> None:
        """The free-form ``params`` against the signatures and declared ranges of the builders
        they are handed to, so that a bad one is refused before anything is built or trained."""
        from e2mc.addons import ADDONS
        from e2mc.methods.registry import METHODS

        method = METHODS.get(self.method.name)  # an unknown name is build_method's error
        if method is not None:
            check_params(method.__init__, self.method.params, "method.params",
                         method.param_ranges, skip=("backbone", "small_images", "in_channels"))
            check_params(method.build_optimizer, self.optim.params, "optim.params",
                         method.optimizer_ranges, skip=("lr", "weight_decay"))
        addon = ADDONS.get(self.addon.name)
        if addon is not None:
            check_params(addon.__init__, self.addon.params, "addon.params", addon.param_ranges)

    def _validate_monitor(self) -> None:
        """The validation split and monitor keys (the metric names: :func:`metric_names`)."""
        vs, mon = self.data.val_split, self.monitor
        if vs is not None and not (0 < vs < 1 or (vs >= 1 and float(vs).is_integer())):
            raise ValueError(f"data.val_split must be a fraction in (0, 1) or a whole count "
                             f">= 1, got {vs}")
        check_distinct("monitor.fractions", mon.fractions, lambda v: 0 < v <= 1,
                       "fractions in (0, 1]")
        check_distinct("monitor.label_seeds", mon.label_seeds, lambda v: v >= 0,
                       "integers >= 0")
        if mon.keep_best is not None:
            mon.keep_best = resolve_metric(mon.keep_best, mon.fractions)
        if (mon.every is not None or mon.keep_best) and vs is None:
            raise ValueError("the monitor and --keep-best evaluate on a validation split: give "
                             "--val-split FRACTION (data.val_split)")
        if mon.keep_best and not mon.enabled:
            raise ValueError("monitor.keep_best needs the monitor: monitor.enabled is false")
        for key, option, given in (("monitor.patience", "--patience", mon.patience is not None),
                                   ("monitor.min_delta", "--set monitor.min_delta",
                                    mon.min_delta != 0)):
            if given and not mon.keep_best:
                raise ValueError(f"{key} ({option}) applies to the keep-best metric, and none "
                                 "is kept: give monitor.keep_best (--keep-best METRIC) too")

    @property
    def lr(self) -> float:
        """The peak learning rate after batch-size scaling."""
        scale = self.training.batch_size / 256 if self.optim.lr_scaling == "linear" else 1.0
        return self.optim.base_lr * scale

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


_FLOAT32_MAX = 3.4028234663852886e38
_DEVICE = re.compile(r"^(auto|cpu|mps|(cuda|xpu)(:\d+)?)$")
