"""Typed run configuration: dataclasses loaded from YAML presets with ``key.sub=value`` overrides.

Every field has a type; values from YAML files and from ``--set`` are converted to it by
OmegaConf's structured config of :class:`RunConfig` (``OmegaConf.merge``,
``OmegaConf.update``), after :func:`_prepared` has done what OmegaConf does not (comma strings,
``none``, integral ``1e3``, one-line errors), and an unknown key is a :class:`ValueError` that
names it. The ``params`` sections are free-form keyword arguments handed to the method, add-on
or optimizer builder; :meth:`RunConfig.validate` checks them against those builders'
signatures (``e2mc.methods``, ``e2mc.addons``, a layer below). List fields
(``monitor.fractions``, ``monitor.label_seeds``, ``training.preempt_signals``) are typed lists;
a YAML list, ``[a, b]`` or the comma string ``a,b`` all give the same list. Their ranges are
checked here too (and :func:`resolve_metric`, :func:`resolve_signals` give their meaning), so
that the configuration imports none of the modules that use it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import signal
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULES = ("constant", "cosine")
LR_SCALINGS = ("none", "linear")
PIPELINES = ("pil", "fast", "device")
MODES = ("continue", "pretrain")


@dataclass
class ModelConfig:
    """The backbone (``e2mc.models.build_backbone``) by name: ``resnet50``,
    ``torchvision:resnet50[:WEIGHTS]``, ``timm:NAME``, ``hf:REPO_ID``, ``cnn5_small``."""

    backbone: str = "resnet50"
    small_images: bool = False
    in_channels: int = 3


@dataclass
class MethodConfig:
    """The SSL method (``e2mc.methods.build_method(name, **params)``)."""

    name: str = "vicreg"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class AddonConfig:
    """The add-on criterion (``e2mc.addons.build_addon(name, **params)``); ``none`` = continued.

    For ``e2mc`` the trainer fills ``space`` from the method's compact space and
    ``batch_size_for_cov`` from the global batch size unless they are given here.
    """

    name: str = "none"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """Learning rate and schedule; the optimizer itself is the method's preset.

    ``lr = base_lr * batch_size / 256`` with ``lr_scaling: linear`` (the authors' rule for VICReg
    and SimSiam), ``lr = base_lr`` with ``none``. ``constant`` is how the continued runs were
    trained; ``cosine`` (with linear warm-up) is for ``pretrain``. Parameter groups flagged
    ``fix_lr`` by the method (SimSiam's predictor) keep their learning rate.
    """

    base_lr: float = 0.003
    lr_scaling: str = "linear"
    weight_decay: float = 1e-6
    schedule: str = "constant"
    warmup_epochs: float = 0.0
    final_lr_fraction: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """Training images and their views (``e2mc.data.build_dataset`` / ``build_views``).

    ``recipe`` defaults to the method's own view recipe. ``limit`` keeps the first N images.
    ``val_split`` holds out a validation part of the training images that training never sees
    (``e2mc.data.holdout_split``): a fraction in (0, 1) or a count >= 1; stratified by class
    where the data set has labels, drawn with ``val_seed``, recorded in the run directory.
    ``pipeline``: ``pil`` (``build_views`` on PIL images), ``fast`` (image folders through
    ``e2mc.data.fast_views.FastViews``: the same draws, tensor decoding and augmentations) or
    ``device`` (the same, with the photometric steps batched on the training device).
    """

    dataset: str | None = None
    split: str = "train"
    image_size: int = 224
    channels: int = 3
    recipe: str | None = None
    num_workers: int = 0
    skip_corrupt: bool = False
    limit: int | None = None
    val_split: float | None = None
    val_seed: int = 0
    pipeline: str = "pil"


@dataclass
class InitConfig:
    """Where a ``continue`` run starts: an official or a project checkpoint.

    ``base_epoch``: how many epochs the base model was trained (the method's epoch-dependent
    behaviour, e.g. SwAV's queue, counts from there); ``None`` reads it from the checkpoint.
    ``load_optimizer``: resume the checkpoint's optimizer state when it has one (VICReg's
    momentum buffers, as the authors continued), keeping this run's learning rate.
    ``checkpoint`` may be a URL (http, https, file; ``#sha256=<hex>`` checked), downloaded once
    into torch.hub's cache. ``new_heads``: a backbone-only checkpoint may start the method's
    heads from random weights (otherwise it is an error).
    """

    checkpoint: str | None = None
    trust: bool = False
    base_epoch: int | None = None
    load_optimizer: bool = True
    new_heads: bool = False


@dataclass
class LoggingConfig:
    """Where a run's metrics go besides ``metrics.jsonl``: TensorBoard (``tensorboard``: null =
    when installed, silently; true = asked for, a note when it is not installed; false = off)
    and Weights & Biases (``wandb: true``, the ``[wandb]`` extra). ``wandb_mode``: ``online``,
    ``offline`` or ``disabled`` (default: wandb's own, e.g. ``$WANDB_MODE``)."""

    tensorboard: bool | None = None
    wandb: bool = False
    wandb_project: str = "e2mc"
    wandb_entity: str | None = None
    wandb_name: str | None = None
    wandb_mode: str | None = None


@dataclass
class TrainingConfig:
    """The loop. ``batch_size`` is global (split over the processes); ``epochs`` counts the
    epochs of this run (continued epochs for ``continue``); ``max_steps`` stops the run (with a
    checkpoint) once that many steps are done; ``cpu_threads`` sets ``torch.set_num_threads``
    (1 is much faster on a busy shared CPU). ``compile`` compiles the backbone
    (``torch.compile``, in place). ``preempt_signals`` (a list; ``[]`` or ``""`` for none) stop the
    run after the current step with a checkpoint and exit code 75; ``requeue`` then runs
    ``scontrol requeue $SLURM_JOB_ID`` under SLURM after a time-limit signal (``SIGUSR1``,
    submitit's ``SIGUSR2``; ``e2mc.training.preemption.SIGNAL_TABLE``)."""

    epochs: int = 10
    batch_size: int = 512
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    log_every: int = 10
    checkpoint_every_steps: int = 0
    keep_epoch_checkpoints: bool = True
    skip_nonfinite: bool = False
    max_steps: int | None = None
    progress: bool = True
    channels_last: bool = False
    find_unused_parameters: bool = False
    cpu_threads: int | None = None
    compile: bool = False
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGHUP"])
    requeue: bool = True


@dataclass
class MonitorConfig:
    """The validation monitor (``e2mc.training.monitor``; needs ``data.val_split``).

    On whenever ``data.val_split`` is set (``enabled: false`` turns it off). At step 0 (the
    starting model), every ``every`` optimizer steps (None: at the end of every epoch) and at
    the last step: kNN top-1 (``knn_k``) and linear probes on the validation split's backbone
    features, and the label-free effective rank and mean marginal entropy of its projector
    embeddings.
    ``fractions``: label budgets of the probes as fractions of the *training* set;
    ``label_seeds``: their label-subset seeds. ``keep_best``: a metric name
    (``val/knn``, ``val/linear_1%``, ...) whose best value so far is kept as ``best.pt``;
    ``patience``: stop after that many evaluations without a gain of more than ``min_delta``.
    """

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
        """Check the values whose range the types cannot express."""
        _check_ranges(self)
        _choice("mode", self.mode, MODES)
        _choice("training.precision", self.training.precision, PRECISIONS)
        _choice("optim.schedule", self.optim.schedule, SCHEDULES)
        _choice("optim.lr_scaling", self.optim.lr_scaling, LR_SCALINGS)
        _choice("data.pipeline", self.data.pipeline, PIPELINES)
        resolve_signals(self.training.preempt_signals)
        for key, value in (("training.epochs", self.training.epochs),
                           ("training.batch_size", self.training.batch_size),
                           ("training.log_every", self.training.log_every),
                           ("data.image_size", self.data.image_size),
                           ("data.channels", self.data.channels)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if self.training.checkpoint_every_steps < 0:
            raise ValueError("training.checkpoint_every_steps must be >= 0 (0 = off)")
        if self.optim.base_lr <= 0:
            raise ValueError(f"optim.base_lr must be > 0, got {self.optim.base_lr}")
        if self.data.num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {self.data.num_workers}")
        self._validate_monitor()
        self._validate_params()

    def _validate_params(self) -> None:
        """The free-form ``params`` against the signatures of the builders they are handed to
        (the method's constructor and ``build_optimizer``, the add-on's constructor), so that a
        value of the wrong type is refused here, before anything is built or trained."""
        from e2mc.addons import ADDONS
        from e2mc.methods.registry import METHODS

        method = METHODS.get(self.method.name)  # an unknown name is build_method's error
        if method is not None:
            check_params(method.__init__, self.method.params, "method.params",
                         skip=("backbone", "small_images", "in_channels"))
            check_params(method.build_optimizer, self.optim.params, "optim.params",
                         skip=("lr", "weight_decay"))
        addon = ADDONS.get(self.addon.name)
        if addon is not None:
            check_params(addon.__init__, self.addon.params, "addon.params")

    def _validate_monitor(self) -> None:
        """The validation split and monitor keys (the metric names: :func:`metric_names`)."""
        vs, mon = self.data.val_split, self.monitor
        if vs is not None and not (0 < vs < 1 or (vs >= 1 and float(vs).is_integer())):
            raise ValueError(f"data.val_split must be a fraction in (0, 1) or a whole count "
                             f">= 1, got {vs}")
        for key, value, low in (("monitor.every", 1 if mon.every is None else mon.every, 1),
                                ("monitor.knn_k", mon.knn_k, 1),
                                ("monitor.probe_epochs", mon.probe_epochs, 1),
                                ("monitor.batch_size", mon.batch_size, 1)):
            if value < low:
                raise ValueError(f"{key} must be >= {low}, got {value}")
        _distinct("monitor.fractions", mon.fractions, lambda v: 0 < v <= 1,
                  "fractions in (0, 1]")
        _distinct("monitor.label_seeds", mon.label_seeds, lambda v: v >= 0, "integers >= 0")
        if mon.patience is not None and mon.patience < 1:
            raise ValueError(f"monitor.patience must be >= 1, got {mon.patience}")
        if mon.min_delta < 0:
            raise ValueError(f"monitor.min_delta must be >= 0, got {mon.min_delta}")
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


def _choice(key: str, value: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


_FLOAT32_MAX = 3.4028234663852886e38
_DEVICE = re.compile(r"^(auto|cpu|mps|(cuda|xpu)(:\d+)?)$")


def _check_ranges(cfg: RunConfig) -> None:
    """Every float is finite; the ranges of the numbers and the device string (each error
    names its key)."""
    for section in dataclasses.fields(cfg):
        obj = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(obj):
            continue
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{section.name}.{f.name} must be a finite number, got {value}")
    t, o = cfg.training, cfg.optim
    for key, value, low in (("training.seed", t.seed, 0), ("training.max_steps", t.max_steps, 1),
                            ("training.cpu_threads", t.cpu_threads, 1),
                            ("init.base_epoch", cfg.init.base_epoch, 0),
                            ("optim.weight_decay", o.weight_decay, 0),
                            ("optim.warmup_epochs", o.warmup_epochs, 0),
                            ("optim.final_lr_fraction", o.final_lr_fraction, 0)):
        if value is not None and value < low:
            raise ValueError(f"{key} must be >= {low}, got {value}")
    if o.final_lr_fraction > 1:
        raise ValueError(f"optim.final_lr_fraction must be <= 1, got {o.final_lr_fraction}")
    if cfg.lr > _FLOAT32_MAX:
        raise ValueError(f"optim.base_lr={o.base_lr:g} gives the learning rate {cfg.lr:g}, "
                         "more than float32 can hold (3.4e38)")
    if not _DEVICE.match(t.device):
        raise ValueError(f"training.device must be auto, cpu, cuda, cuda:N or mps; got "
                         f"{t.device!r}")


# --------------------------------------------------------------------------- field values
#: The monitor's label-free metrics (``e2mc.training.monitor``).
LABEL_FREE = ("val/rankme", "val/entropy")


def comma_list(text: Any, cast: Any = str) -> list[Any]:
    """``"a, b,,c"`` -> ``[cast("a"), cast("b"), cast("c")]``: the items of a comma-separated
    list (a config value, an option), stripped, empty ones dropped."""
    return [cast(item) for item in (t.strip() for t in str(text).split(",")) if item]


def _distinct(key: str, values: Sequence[Any], valid: Any, what: str) -> None:
    """Refuse an empty list, a repeated value or one that does not pass ``valid``."""
    if not values or not all(valid(v) for v in values) or len(set(values)) != len(values):
        raise ValueError(f"{key} must be a list of distinct {what}, got {list(values)}")


def metric_names(fractions: Sequence[float]) -> list[str]:
    """Every metric the monitor logs, for ``monitor.fractions``."""
    from e2mc.data.subsets import fraction_label

    probes = [f"val/linear_{fraction_label(f)}" for f in fractions]
    return ["val/knn", *probes, *LABEL_FREE]


def resolve_metric(name: str, fractions: Sequence[float]) -> str:
    """The full name of a monitor metric (``knn`` and ``val/knn`` both name ``val/knn``); an
    unknown name is a ``ValueError`` that lists the metrics and the close matches."""
    names = metric_names(fractions)
    full = name if name.startswith("val/") else f"val/{name}"
    if full in names:
        return full
    close = difflib.get_close_matches(full, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown monitor metric {name!r}: the monitor logs {', '.join(names)}"
                     f"{hint}")


def resolve_signals(spec: Sequence[str | signal.Signals] | None) -> tuple[signal.Signals, ...]:
    """``["SIGTERM", "SIGUSR1"]`` (``training.preempt_signals``: names with or without ``SIG``,
    any case, or numbers) -> signals; ``[]``, ``["none"]`` or ``None`` -> none. Raises
    ``ValueError`` naming an unknown signal or one that cannot be handled (``SIGKILL``,
    ``SIGSTOP``)."""

    if isinstance(spec, str):
        raise TypeError(f"a list of signal names, not the string {spec!r}")
    names = [s if isinstance(s, signal.Signals) else str(s).strip() for s in spec or ()]
    names = [n for n in names if isinstance(n, signal.Signals) or (n and n.lower() != "none")]
    out = []
    for name in names:
        if isinstance(name, signal.Signals):
            out.append(name)
            continue
        try:
            sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
                name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()]
        except (KeyError, ValueError):
            raise ValueError(f"unknown signal {name!r} in training.preempt_signals "
                             f"(e.g. SIGTERM,SIGUSR1)") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{sig.name} cannot be caught; use e.g. SIGTERM or SIGUSR1")
        out.append(sig)
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------- YAML input
#: The most nodes a YAML text may stand for once its aliases are expanded (a config has a few
#: hundred): an "alias bomb" of a few lines that stands for 10**9 strings is refused.
YAML_MAX_NODES = 100_000


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(f"duplicate key {key!r} at line {again.line + 1} (first given at line "
                         f"{first.line + 1}); a mapping names each key once")


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (a merge key ``<<``
    may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not key_node.start_mark:
                raise _DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Refuse a node graph with an alias inside its own anchor, or one that stands for more
    than :data:`YAML_MAX_NODES` nodes once its aliases are expanded. Each node is counted
    once (its expanded size is remembered), so a bomb is refused without being expanded."""
    expanded: dict[int, int] = {}  # id(node) -> nodes it stands for, once finished
    counts = {id(root): 1}  # nodes counted so far under each node of the current path
    stack = [(root, iter(_children(root)))]
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is not None and id(child) in counts:
            raise ValueError(f"{where}: recursive YAML alias (the anchor at line "
                             f"{child.start_mark.line + 1} holds an alias to itself)")
        if child is not None and id(child) not in expanded:
            counts[id(child)] = 1
            stack.append((child, iter(_children(child))))
            continue
        if child is None:  # node finished: hand its size to its parent
            stack.pop()
            expanded[id(node)] = counts.pop(id(node))
            if not stack:
                return
            child, node = node, stack[-1][0]
        counts[id(node)] += expanded[id(child)]
        if counts[id(node)] > YAML_MAX_NODES:
            raise ValueError(f"{where}: the YAML aliases expand to more than "
                             f"{YAML_MAX_NODES:,} values; a config this large is refused "
                             "(an alias bomb?)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml_text(text: str, where: str) -> Any:
    """Parse one YAML document of user input (a config file, a ``--set`` value, a trials file)
    safely and within bounds: ``yaml.safe_load`` that also refuses duplicate keys, recursive
    aliases, aliases that expand beyond :data:`YAML_MAX_NODES` nodes and nesting deeper than the
    parser can follow. Every refusal is a one-line ``ValueError`` beginning with ``where``."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, where)
        return loader.construct_document(node)
    except _DuplicateKeyError as err:
        raise ValueError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err}"
                         f"{at})") from None
    except RecursionError:
        raise ValueError(f"{where}: the YAML is nested too deeply") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """:func:`load_yaml_text` of a file (named in every error); a missing file is a
    ``FileNotFoundError``."""
    return load_yaml_text(Path(path).read_text(encoding="utf-8"), str(path))


# --------------------------------------------------------------------------- coercion
def _number(key: str, value: Any, tp: type) -> Any:
    """``value`` (a number or its text) as ``tp`` (int or float); ``ValueError`` naming ``key``."""
    try:
        if isinstance(value, bool):
            raise ValueError
        as_float = float(value)
        if tp is int and not as_float.is_integer():
            raise ValueError
        return int(as_float) if tp is int else as_float
    except (TypeError, ValueError):
        raise ValueError(f"config key {key!r} expects {tp.__name__}, got {value!r}") from None


_NO_CHECK = object()


def _param_value(key: str, value: Any, tp: Any) -> Any:
    """``value`` if it is of the annotated type ``tp`` (a number written as text is converted);
    ``ValueError`` naming ``key`` otherwise. Types this cannot tell (a class other than the
    plain ones, ``Any``) accept anything."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is _NO_CHECK:
        return value
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(tp)
        if value is None and type(None) in arms:
            return None
        for arm in (a for a in arms if a is not type(None)):
            try:
                return _param_value(key, value, arm)
            except ValueError:
                continue
    elif origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp in (int, float):
        if isinstance(value, tp if tp is int else (int, float)) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            return _number(key, value, tp)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, tuple, Sequence, Iterable):
        if isinstance(value, (list, tuple)):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            inner = args[0] if len(set(args)) == 1 else Any
            return type(value)(_param_value(f"{key}[{i}]", v, inner)
                               for i, v in enumerate(value))
    elif origin in (dict, Mapping) or tp is dict:
        if isinstance(value, Mapping):
            return value
    elif isinstance(tp, type):
        if isinstance(value, tp):
            return value
    else:
        return value
    raise ValueError(f"config key {key!r} expects {_type_text(tp)}, got {value!r}")


def _type_text(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def check_params(builder: Any, params: dict[str, Any], section: str,
                 skip: Iterable[str] = ()) -> None:
    """Check the ``params`` handed to ``builder`` (a function or method) against its signature:
    names it does not take (unless it takes ``**kwargs``) and values of another type than
    annotated are a ``ValueError`` naming ``section.name``; numbers written as text (``1e3``)
    are converted in place. ``skip``: parameters the caller fills itself."""
    import inspect

    signature = inspect.signature(builder)
    try:
        hints = typing.get_type_hints(builder)
    except Exception:  # an annotation that cannot be resolved: names only  # noqa: BLE001
        hints = {}
    takes = {n: p for n, p in signature.parameters.items()
             if n != "self" and n not in skip
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for name, value in params.items():
        if name not in takes:
            if open_ended:
                continue
            raise ValueError(f"unknown config key {section}.{name}; "
                             f"{section} takes: {', '.join(sorted(takes)) or 'nothing'}")
        params[name] = _param_value(f"{section}.{name}", value, hints.get(name, _NO_CHECK))


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _prepared(data: Any, cls: type, prefix: str = "", missing_ok: bool = False
              ) -> dict[str, Any]:
    """``data`` as OmegaConf can merge it into ``cls``: what OmegaConf does not convert itself
    (a comma string for a list, ``none`` for null, a YAML mapping as text, null ``params``)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping")
    hints, out = _hints(cls), {}
    for key, value in data.items():
        full, tp = f"{prefix}{key}", hints.get(key)
        if tp is None:
            raise ValueError(_unknown(full, hints))
        args, origin = typing.get_args(tp), typing.get_origin(tp)
        if not missing_ok:
            _refuse_missing(full, value)
        if dataclasses.is_dataclass(tp):
            value = _prepared(value, tp, f"{full}.", missing_ok)
        elif isinstance(value, str) and value.lower() in ("null", "none", "~") \
                and type(None) in args:
            value = None
        elif origin is list and (value is None or isinstance(value, str)):
            value = [] if value is None else load_yaml_text(value, f"config key {full!r}") \
                if value.strip().startswith("[") else comma_list(value)
        elif (tp is int or int in args) and isinstance(value, (str, float)):
            value = _number(full, value, int)  # OmegaConf refuses "1e3" and 3.0
        elif tp is bool and str(value).strip().lower() not in ("true", "yes", "on", "1",
                                                               "false", "no", "off", "0"):
            raise ValueError(f"config key {full!r} expects a boolean, got {value!r}")
        elif origin is list and isinstance(value, Mapping):
            raise ValueError(f"config key {full!r} expects a list, got {value!r}")
        elif origin is dict:
            value = load_yaml_text(value, f"config key {full!r}") \
                if isinstance(value, str) else value or {}
        out[key] = value
    return out


def _without_missing(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _without_missing(v) for k, v in data.items()
                if not (isinstance(v, str) and v.strip() == "???")}
    return data


def _refuse_missing(key: str, value: Any) -> None:
    """OmegaConf's missing-value marker ``???`` is an error naming the key (OmegaConf would
    keep the default in its place, silently): a config that leaves a value to be filled in must
    have it filled in."""
    if isinstance(value, str) and value.strip() == "???":
        raise ValueError(f"config key {key!r} is ??? (a value still to be given): set it in "
                         f"the file or with --set {key}=VALUE")
    if isinstance(value, Mapping) and not dataclasses.is_dataclass(value):
        for k, v in value.items():
            if not isinstance(v, Mapping):
                _refuse_missing(f"{key}.{k}", v)


def _build(data: Mapping[str, Any], missing_ok: bool = False) -> RunConfig:
    """The defaults with ``data`` laid over them: OmegaConf's structured config of
    :class:`RunConfig` converts the values to the field types and refuses unknown keys; a
    ``???`` is refused unless ``missing_ok`` (one file of a ``base:`` chain, whose later
    files or overrides may give the value)."""
    try:
        prepared = _prepared(data, RunConfig, missing_ok=missing_ok)
        if missing_ok:  # checked for the rest; ??? stays in the data for the final build
            prepared = _without_missing(prepared)
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), _literal(prepared))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise ValueError(f"config key {err.full_key!r}: {str(err.msg).splitlines()[0]}") from None


def _literal(value: Any) -> Any:
    """``value`` as OmegaConf holds it as given: ``${`` escaped in every string (text, not an
    interpolation; escaping twice changes nothing), a scalar it cannot hold (a YAML date) as
    text."""
    if isinstance(value, Mapping):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return re.sub(r"(?<!\\)\$\{", r"\\${", str(value))


def _unknown(full: str, hints: Mapping[str, Any]) -> str:
    section = full.rsplit(".", 1)[0] if "." in full else "the top level"
    return (f"unknown config key {full!r}; valid keys in {section}: "
            f"{', '.join(sorted(hints))}")


def _overridden(data: Mapping[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """``data`` with ``key.sub=value`` overrides set (``OmegaConf.update``, a mapping value
    replacing the old one); a value inside ``params`` is YAML read by :func:`load_yaml_text`
    (duplicate keys, alias bombs), a field's value stays text for :func:`_prepared`."""
    conf = OmegaConf.create(dict(data))
    for assignment in assignments:
        if "=" not in assignment:
            raise ValueError(f"override {assignment!r} must look like key.sub=value")
        key, raw = (part.strip() for part in assignment.split("=", 1))
        try:
            value = _literal(load_yaml_text(raw, f"--set {key}") if ".params." in key else raw)
            OmegaConf.update(conf, key, value, merge=False)  # a field's text: _prepared
        except OmegaConfBaseException as err:
            raise ValueError(f"--set {key}: {str(err).splitlines()[0]}") from None
    return OmegaConf.to_container(conf)


# --------------------------------------------------------------------------- presets
# A preset or YAML file may start from another one: ``base: <preset name or YAML file>`` plus only
# what changes. A relative file name in ``base`` is relative to the file that names it.
BASE_KEY = "base"


def preset_names() -> list[str]:
    """Names of the presets shipped in ``e2mc/configs``."""
    root = resources.files("e2mc") / "configs"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _locate(ref: str, folder: Path | None,
            preset_only: bool = False) -> tuple[str, Any, Path | None]:
    """``(identity, readable source, folder for its relative bases)`` of a preset or file;
    ``folder`` is None for a shipped preset (whose bases are presets too)."""
    path = Path(ref)
    if folder is not None and not path.is_absolute():
        path = folder / path
    # a folder named like a preset (a run directory) does not hide the preset
    if not preset_only and (path.suffix in (".yaml", ".yml") or path.is_file()):
        if not path.is_file():
            raise ValueError(f"config file {ref!r} does not exist")
        path = path.resolve()
        return str(path), path, path.parent
    resource = resources.files("e2mc") / "configs" / f"{ref}.yaml"
    if not resource.is_file():
        names = preset_names()
        close = difflib.get_close_matches(ref, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown preset {ref!r}; {hint}presets: {', '.join(names)}")
    return ref, resource, None


def merge_config(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` laid over ``base`` (``OmegaConf.merge``: mappings merge key by key, anything
    else is replaced). A section whose ``name`` changes (another method or add-on) drops the
    base's ``params``, which belong to the other builder; ``params: null`` clears them."""
    base = {key: {k: v for k, v in section.items() if k != "params"}
            if isinstance(section, Mapping) and isinstance(override.get(key), Mapping)
            and override[key].get("name", section.get("name")) != section.get("name")
            else section for key, section in base.items()}
    merged = OmegaConf.to_container(OmegaConf.merge(base, _swap(override, "???", _MISSING)))
    return _swap(merged, _MISSING, "???")  # (merging ??? would keep the base's value)


_MISSING = "\0e2mc-missing\0"


def _swap(data: Any, old: str, new: str) -> Any:
    """``data`` with every string ``old`` replaced by ``new``, at any depth."""
    if isinstance(data, Mapping):
        return {k: _swap(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [_swap(v, old, new) for v in data]
    return new if isinstance(data, str) and data.strip() == old else data


def _resolve(ref: str, folder: Path | None, chain: tuple[str, ...]) -> dict[str, Any]:
    ident, source, own_folder = _locate(ref, folder, preset_only=bool(chain) and folder is None)
    if ident in chain:
        raise ValueError(f"config inheritance cycle: {' -> '.join((*chain, ident))}")
    data = load_yaml_text(source.read_text(encoding="utf-8"), ident) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{ident}: a config file must be a mapping of sections")
    data = _literal(data)
    base = data.pop(BASE_KEY, None)
    try:  # strict per file, so that an unknown key is reported with the file that has it
        _build(data, missing_ok=True)
    except ValueError as err:
        raise ValueError(f"{ident}: {err}") from None
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"{ident}: {BASE_KEY!r} must be a preset name or a YAML file, "
                         f"got {base!r}")
    return merge_config(_resolve(base, own_folder, (*chain, ident)), data)


def resolve_config_file(name_or_path: str) -> dict[str, Any]:
    """The mapping a preset or YAML file stands for, its ``base`` chain merged in."""
    return _resolve(name_or_path, None, ())


def preset_summary(name: str) -> tuple[str | None, str]:
    """``(base, description)`` of a shipped preset; the description is its first comment line."""
    _, resource, _ = _locate(name, None, preset_only=True)
    text = resource.read_text()
    description = ""
    for line in text.splitlines():
        if line.strip():
            if line.lstrip().startswith("#"):
                description = line.lstrip().lstrip("#").strip()
            break
    base = (load_yaml_text(text, name) or {}).get(BASE_KEY)
    return base, description


def load_config(name_or_path: str | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from a preset name or YAML file (with its ``base`` chain),
    then apply ``overrides``."""
    data = resolve_config_file(name_or_path) if name_or_path is not None else {}
    cfg = _build(_overridden(data, overrides))
    cfg.validate()
    return cfg


def config_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Rebuild a config from :meth:`RunConfig.to_dict` output (e.g. a checkpoint's copy)."""
    cfg = _build(data)
    cfg.validate()
    return cfg


# --------------------------------------------------------------------------- differences
def flatten_config(data: Mapping[str, Any], whole_params: bool = False,
                   prefix: str = "") -> dict[str, Any]:
    """``{"training.epochs": 10, ...}``: a nested configuration mapping by dotted key (an empty
    mapping has no keys); with ``whole_params`` a ``params`` section is one value."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and not (whole_params and full.endswith("params")):
            out.update(flatten_config(value, whole_params, f"{full}."))
        else:
            out[full] = value
    return out


def config_differences(config: Mapping[str, Any], base: Mapping[str, Any] | None = None,
                       whole_params: bool = False
                       ) -> tuple[str, list[tuple[str, Any, Any]]]:
    """The keys where ``config`` (``RunConfig.to_dict()``, e.g. as a checkpoint records it)
    differs from ``base``, as ``(base name, [(dotted key, base value, value)])``.

    Without ``base``: the shipped preset named by ``config``'s ``name`` when there is one, else
    the defaults; a key ``config`` lacks (recorded by an older version of the package) is left
    out, a key the base lacks (a ``params`` entry) shows ``None`` on that side. A given
    ``base`` (the configuration a run was trained with, when it resumes) counts a key it lacks
    as its default, and every key of either side is compared. ``whole_params``: compare the
    ``params`` sections whole."""
    if base is None:
        name = config.get("name")
        if isinstance(name, str) and name in preset_names():
            base_name, base = f"preset {name}", load_config(name).to_dict()
        else:
            base_name, base = "the defaults", RunConfig().to_dict()
        only_config_keys = True
    else:
        base_name, only_config_keys = "the given configuration", False
        base = _typed(base)
    flat, flat_base = flatten_config(config, whole_params), flatten_config(base, whole_params)
    typed = flatten_config(_typed(config), whole_params)  # an older comma string as its list
    flat = {k: typed.get(k, v) for k, v in flat.items()}
    keys = [k for k in dict.fromkeys([*flat_base, *flat]) if k in flat or not only_config_keys]
    return base_name, [(k, flat_base.get(k), flat.get(k)) for k in keys
                       if flat_base.get(k) != flat.get(k)]


def _typed(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with every key given (others at their defaults) coerced to its field's type,
    as :meth:`RunConfig.to_dict` has it; unchanged when it has a key this version does not
    know (compare what there is)."""
    try:
        return _build(data).to_dict()
    except ValueError:
        return data
