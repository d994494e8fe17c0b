"""From a :class:`~e2mc.config.RunConfig` to the objects a run trains: the method,
the add-on, the training data set with its views, and the starting model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir, run_model
from e2mc.config import RunConfig, resolve_signals
from e2mc.distributed import is_main_process


def build_method_from_config(cfg: RunConfig, backbone: Any = None,
                             feature_dim: int | None = None) -> Any:
    """``build_method`` from ``cfg``; ``backbone``: a module replacing ``model.backbone``."""
    from e2mc.methods import build_method

    kwargs = method_kwargs(cfg)
    if backbone is not None:
        kwargs.update(backbone=backbone, feature_dim=feature_dim)
    return build_method(cfg.method.name, **kwargs)


def build_addon_from_config(cfg: RunConfig, method: Any) -> Any:
    """``build_addon``; for ``e2mc`` the space and the covariance batch default as the
    authors ran it."""
    from e2mc.addons import build_addon

    params = dict(cfg.addon.params)
    if cfg.addon.name == "e2mc":
        params.setdefault("space", method.compact_space)
        params.setdefault("batch_size_for_cov", cfg.training.batch_size)
    return build_addon(cfg.addon.name, **params)


def training_images(cfg: RunConfig) -> Any:
    """``(images, skipped)``: the training split of ``data.dataset`` (first ``data.limit``),
    before the hold-out and without a transform, and the number of unreadable images skipped."""
    from e2mc.data import LabeledSubset, build_dataset

    if cfg.data.dataset is None:
        raise ValueError("data.dataset is not set: give a data set ('builtin', an IDX folder, an "
                         "image folder or an .npz file) with --data or --set data.dataset=...")
    base = build_dataset(cfg.data.dataset, cfg.data.split, skip_corrupt=cfg.data.skip_corrupt)
    skipped = int(getattr(base, "num_skipped", 0))
    if cfg.data.limit is not None:
        limited = range(min(cfg.data.limit, len(base)))
        base = LabeledSubset(base, limited)
    return base, skipped


def holdout(cfg: RunConfig, images: Any) -> dict[str, Any] | None:
    """The validation split record of ``images`` (``train``/``val`` indices and how drawn); None
    without ``data.val_split``."""
    from e2mc.data import dataset_labels
    from e2mc.data.holdout import holdout_split

    if cfg.data.val_split is None:
        return None
    train, val, stratified = holdout_split(len(images), cfg.data.val_split, cfg.data.val_seed,
                                           dataset_labels(images, False))
    if len(train) < cfg.training.batch_size:
        raise ValueError(f"data.val_split={cfg.data.val_split:g} leaves {len(train)} training "
                         f"images, less than one batch of {cfg.training.batch_size}; hold out "
                         "fewer images or use a smaller batch")
    return {"val_split": cfg.data.val_split, "val_seed": cfg.data.val_seed,
            "dataset": cfg.data.dataset, "split": cfg.data.split, "limit": cfg.data.limit,
            "num_images": len(images), "stratified": stratified,
            "train": train.tolist(), "val": val.tolist()}


def build_train_dataset(cfg: RunConfig, method: Any, split: dict[str, Any] | None = None,
                        images: tuple[Any, int] | None = None, pipeline: str = "pil") -> Any:
    """The training images (``images``, built when not given) with the view recipe; with a
    validation ``split`` only its training part; ``pipeline``: ``data.pipeline`` as chosen."""
    from e2mc.data import LabeledSubset, MultiViewDataset, build_views

    base, skipped = images or training_images(cfg)
    if split is not None:
        base = LabeledSubset(base, split["train"])
    views = build_views(cfg.data.recipe or method.view_recipe, cfg.data.image_size,
                        cfg.data.channels)
    if pipeline in ("fast", "device"):
        from e2mc.data import fast_views

        fast = fast_views.FastViews(views, mode="cpu" if pipeline == "fast" else "device")
        dataset = fast_views.FastViewDataset(base, fast)
        # read by the trainer: "device" hands over uint8 crops and their parameters (the
        # photometric steps run on the training device), "fast" batches of finished 8-bit
        # views (FastViewDataset.collated); the training device normalises both
        dataset.device_augment = fast_views.DeviceAugment(fast, photometric=pipeline == "device")
        if pipeline == "device":
            dataset.collate_fn = fast_views.collate_device_views
    else:
        dataset = MultiViewDataset(base, views)
    dataset.num_skipped = skipped  # unreadable images dropped by --skip-corrupt
    return dataset


def build_validation_data(cfg: RunConfig, split: dict[str, Any], images: Any = None) -> Any:
    """The monitor's held-out images (eval transform) as a ``ValidationData``."""
    from e2mc.data import LabeledSubset, Transformed, dataset_labels, eval_transform
    from e2mc.training.monitor import ValidationData

    images = Transformed(images if images is not None else training_images(cfg)[0],
                         eval_transform(cfg.data.image_size, cfg.data.channels))
    if dataset_labels(images, False) is None:
        raise ValueError("the validation monitor needs class labels; this data set has none")
    val = LabeledSubset(images, split["val"])
    return ValidationData.from_dataset(val, val.labels, train_size=len(split["train"]),
                                       seed=cfg.data.val_seed)


def build_callbacks(cfg: RunConfig, method: Any, split: dict[str, Any] | None,
                    images: Any = None) -> list[Any]:
    """The run's callbacks in order: pre-emption, then with a validation split the monitor,
    keep-best and the monitor's plot, then the collapse warning."""
    from e2mc.training.collapse_monitor import CollapseMonitor
    from e2mc.training.keep_best import KeepBest
    from e2mc.training.monitor import MonitorPlot, ValidationMonitor
    from e2mc.training.preemption import PreemptionCallback

    callbacks: list[Any] = []
    if resolve_signals(cfg.training.preempt_signals):
        callbacks.append(PreemptionCallback(cfg.training.preempt_signals, cfg.training.requeue))
    mon = cfg.monitor
    if mon.enabled and split is not None:
        monitor = ValidationMonitor(build_validation_data(cfg, split, images), mon)
        keep = KeepBest(mon.keep_best, mon.patience, mon.min_delta) if mon.keep_best else None
        callbacks += [monitor, *([keep] if keep else []), MonitorPlot(monitor, keep)]
    callbacks.append(CollapseMonitor(cfg.method.name, getattr(method, "hparams", {})))
    return callbacks


def method_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of ``build_method`` (besides the name) from the config."""
    return {"backbone": cfg.model.backbone, "small_images": cfg.model.small_images,
            "in_channels": cfg.model.in_channels, **cfg.method.params}


def load_start(cfg: RunConfig, backbone: Any = None, feature_dim: int | None = None
               ) -> tuple[Any, int, Callable[[Any], Any] | None]:
    """The starting model of a run: ``init.checkpoint`` loaded strictly (official, project or
    ``builtin:NAME``), else the pretrained weights ``model.backbone`` names, else a ``backbone``
    module with its own weights, else fresh weights (``pretrain`` only); a checkpoint and
    pretrained weights (or a module) together are an error.

    Returns ``(method, base_epoch, prepare_optimizer)``: ``base_epoch`` is ``init.base_epoch`` or
    the checkpoint's epoch; ``prepare_optimizer`` restores its optimizer state when
    ``init.load_optimizer``."""
    from e2mc.checkpoints import load_start_model, restore_optimizer_state
    from e2mc.models import parse_backbone_name, pretrained_weights, timm_parts
    from e2mc.training.checkpointing import load_optimizer_state_keep_hyperparameters

    weights = None if backbone is not None else pretrained_weights(cfg.model.backbone)
    if cfg.init.checkpoint is None:
        if backbone is not None:
            return (build_method_from_config(cfg, backbone, feature_dim),
                    cfg.init.base_epoch or 0, None)
        if cfg.mode == "continue" and weights is None:
            raise ValueError("continue needs a starting checkpoint (--from PATH, or --set "
                             "init.checkpoint=PATH) or a backbone with pretrained weights "
                             "(--backbone torchvision:NAME:WEIGHTS, timm:ARCH.TAG or hf:REPO)")
        return build_method_from_config(cfg), cfg.init.base_epoch or 0, None
    if backbone is not None:
        raise ValueError(f"a module to continue and init.checkpoint {cfg.init.checkpoint} "
                         "names a checkpoint: give one (load the checkpoint into the module "
                         "first)")
    if weights is not None and weights["library"] != "transformers":  # hf:REPO: architecture
        source, model, _ = parse_backbone_name(cfg.model.backbone)
        plain = model if source == "torchvision" else f"timm:{timm_parts(model)[0]}"
        raise ValueError(f"--backbone {cfg.model.backbone} names pretrained weights and --from "
                         f"{cfg.init.checkpoint} names a checkpoint: give one (the "
                         f"architecture without weights is --backbone {plain})")
    from e2mc.checkpoints.remote import is_url

    path: str | Path = cfg.init.checkpoint
    if not is_url(path):  # a URL is fetched (and checked) by load_start_model
        # a file, builtin:NAME, or a training run's model (best.pt when keep-best wrote one)
        model = run_model(path)
        if model is not None and model.from_directory and is_main_process():
            which = "kept model" if model.kept else "last step"
            print(f"starting model: {model.path} (the {which} of run {path}; name "
                  f"{RunDir(path).checkpoint} for its last step)", file=sys.stderr)
        path = model.path if model is not None else Path(path)
        if not path.is_file():
            raise ValueError(f"starting checkpoint {path} does not exist")
    method, info = load_start_model(path, cfg.method.name, trust=cfg.init.trust,
                                     new_heads=cfg.init.new_heads, **method_kwargs(cfg))
    opt_state = info.get("optimizer")
    prepare: Callable[[Any], Any] | None = None
    if opt_state is not None and cfg.init.load_optimizer:
        prepare = (partial(load_optimizer_state_keep_hyperparameters, state=opt_state)
                   if info["optimizer_layout"] == "project"
                   else partial(restore_optimizer_state, method=method, state=opt_state))
    epoch = info.get("epoch")
    base_epoch = cfg.init.base_epoch if cfg.init.base_epoch is not None else int(epoch or 0)
    return method, base_epoch, prepare
