"""The one way into training: :func:`run_training` (behind ``continue``, ``pretrain``,
``search``, the demo and the harnesses) and :func:`continue_module` for a module of your own."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir, writer_lock
from e2mc.config import RunConfig
from e2mc.files import atomic_write_json, atomic_write_text
from e2mc.models.input_size import check_backbone_input, one_pixel_note, pooled_dim
from e2mc.training.build import (
    build_addon_from_config,
    build_callbacks,
    build_method_from_config,
    build_train_dataset,
    holdout,
    load_start,
    training_images,
)
from e2mc.training.checkpointing import check_resume_config, check_resume_data
from e2mc.training.result import TrainResult


def run_training(cfg: RunConfig, run_dir: str | Path, override_config: bool = False, *,
                 module: Any = None, feature_dim: int | None = None,
                 done_marker: bool = False) -> TrainResult:
    """Build everything from ``cfg`` and train in ``run_dir``, resuming its checkpoint when the
    configuration and images pass :func:`~e2mc.training.checkpointing.check_resume_config`
    and :func:`~e2mc.training.checkpointing.check_resume_data` (``override_config``:
    ``--override-config``).

    ``module``: an ``nn.Module`` that replaces ``model.backbone`` with its own weights (trained in
    place; ``feature_dim`` measured when not given). ``done_marker``: mark the run done when it
    reaches its end, and return a run marked done untrained after the same checks (a pre-empted
    run is never marked); such callers offer no ``--override-config``."""
    from e2mc.data.identity import data_identity
    from e2mc.distributed import init_runtime
    from e2mc.errors import ConfigMismatchError
    from e2mc.training.fit import fit_to_data, needs_data

    run = RunDir(run_dir)
    overridable = not done_marker
    images = training_images(cfg) if needs_data(cfg) else None  # read once
    cfg, fitted = fit_to_data(cfg, images)  # the values the configuration leaves to its data
    if fitted:  # (a size the backbone cannot take: one line before anything is built)
        check_backbone_input(cfg.model.backbone, cfg.data.image_size, cfg.model.in_channels,
                             cfg.model.small_images, option="--set data.image_size=N")
    first_step, changes = check_resume_config(run.root, cfg.to_dict(), override_config,
                                              overridable)
    done = run.read_done() if done_marker else None
    if done is not None:
        identity = data_identity((images or training_images(cfg))[0])
        if check_resume_data(run.root, identity, cfg.to_dict(), False, False) is not None:
            raise ConfigMismatchError(f"{run.root} is done, but was trained on other images "
                                      f"than {cfg.data.dataset} holds now; use a new directory")
        return TrainResult.done(run.checkpoint, done["step"], done.get("end"))
    if module is not None and feature_dim is None:
        feature_dim = pooled_dim(module, cfg.data.channels, cfg.data.image_size)
    runtime = init_runtime(cfg.training.device)
    # one writer per run directory: the main process holds its lock for the whole run
    with writer_lock(run.root) if runtime.is_main else nullcontext():
        result = _train(cfg, run, runtime, override_config, overridable, module, feature_dim,
                        (first_step, changes), images, fitted)
        if done_marker and result.finished and runtime.is_main:
            run.mark_done(result.step, result.stop_reason or "completed")
    return result


def continue_module(module: Any, config: str | Path, run_dir: str | Path,
                    overrides: Sequence[str] = (), feature_dim: int | None = None,
                    override_config: bool = False) -> TrainResult:
    """Continue training your own backbone ``module`` (``[B, C, H, W]`` to ``[B, feature_dim]``)
    with the preset or YAML ``config`` and ``--set``-style ``overrides``, as ``e2mc continue``
    does; new heads, everything else as for a named backbone. The module is copied, not changed;
    the result is the run directory. Running it again with the same arguments resumes."""
    import copy

    from e2mc.config import load_config

    cfg = load_config(config, ["mode=continue", *overrides])
    return run_training(cfg, run_dir, override_config, module=copy.deepcopy(module),
                        feature_dim=feature_dim)


def _train(cfg: RunConfig, run: RunDir, runtime: Any, override_config: bool,
           overridable: bool, backbone: Any, feature_dim: int | None,
           config_change: tuple[int, dict[str, tuple[Any, Any]]], images: Any = None,
           fitted: dict[str, Any] | None = None) -> TrainResult:
    import torch

    from e2mc.data.identity import data_identity
    from e2mc.models import weights_from_checkpoint
    from e2mc.training.hardware import chosen, describe, hardware_choices, is_image_folder
    from e2mc.training.trainer import Trainer

    if cfg.training.cpu_threads is not None:
        torch.set_num_threads(cfg.training.cpu_threads)
    torch.manual_seed(cfg.training.seed)
    start = None
    if run.checkpoint.exists():  # resume: the weights come from the run's checkpoint
        with weights_from_checkpoint():  # (no pretrained weights fetched again)
            method = build_method_from_config(cfg, backbone, feature_dim)
        base_epoch, prepare = 0, None
    else:
        method, base_epoch, prepare = load_start(cfg, backbone, feature_dim)
        start = start_record(cfg, method, backbone)
    addon = build_addon_from_config(cfg, method)
    # read once: the split, the training views, the monitor
    images = images or training_images(cfg)
    identity = data_identity(images[0])  # what the run is bound to (start.json, checkpoints)
    data_change = check_resume_data(run.root, identity, cfg.to_dict(), override_config,
                                    overridable)
    split = _split(cfg, run, runtime.is_main, images[0])
    choices = {**(fitted or {}),  # once a run
               **hardware_choices(cfg, runtime.device, is_image_folder(images[0]))}
    dataset = build_train_dataset(cfg, method, split, images,
                                  chosen(cfg, choices, "data.pipeline"))
    callbacks = build_callbacks(cfg, method, split, images[0])
    if runtime.is_main:
        run.root.mkdir(parents=True, exist_ok=True)
        first_step, changes = config_change
        for key, (old, new) in changes.items():
            print(f"config change on resume: {key}: {old!r} -> {new!r}", file=sys.stderr)
        recorded = {key: {"old": old, "new": new} for key, (old, new) in changes.items()}
        if data_change is not None:
            recorded["data"] = {"old": data_change[1], "new": identity}
            print(f"data change on resume: the run goes on with these {identity['size']} "
                  f"images (content {identity['content'][:12]}), recorded in "
                  f"{run.config_changes}", file=sys.stderr)
        if recorded:
            run.record_config_change(first_step, recorded)
        atomic_write_text(run.config, cfg.to_yaml())
        print(f"{cfg.mode} {cfg.name}: {cfg.method.name} + add-on {cfg.addon.name}, "
              f"{len(dataset)} images ({dataset.num_skipped} unreadable skipped), "
              f"batch {cfg.training.batch_size} over "
              f"{runtime.world_size} process(es) on {runtime.device}, lr {cfg.lr:g}, "
              f"{cfg.training.epochs} epoch(s)"
              + (f" (training.max_steps={cfg.training.max_steps}: it stops at that step)"
                 if cfg.training.max_steps is not None else "")
              + f", run directory {run.root}"
              + (f"; {len(split['val'])} images held out for validation" if split else ""),
              file=sys.stderr)
        if choices:
            print(f"auto: {describe(choices)}", file=sys.stderr)
        if start is not None:
            start["data"] = identity
            start["auto"] = {key: c.value for key, c in choices.items()}
            atomic_write_json(start, run.start)
            print(f"start: {start['from']}, backbone sha256 {start['backbone_sha256'][:16]}",
                  file=sys.stderr)
            note = one_pixel_note(method.backbone, cfg.data.image_size,
                                  cfg.data.channels, start.get("module") or cfg.model.backbone)
            if note is not None:  # (a fresh run's; a resumed one said it at its start)
                print(note, file=sys.stderr)
    trainer = Trainer(method, addon, dataset, cfg, run.root, runtime=runtime,
                      base_epoch=base_epoch,
                      prepare_optimizer=prepare, callbacks=callbacks, data_identity=identity,
                      hardware=choices)
    return trainer.fit()


def start_record(cfg: RunConfig, method: Any, backbone: Any = None) -> dict[str, Any]:
    """What ``start.json`` records of a run's start: ``from`` (in words), ``checkpoint``,
    ``pretrained``, ``module`` (its class) and ``backbone_sha256`` of the starting backbone."""
    from e2mc.evaluation.features import state_dict_digest
    from e2mc.models import pretrained_weights

    start_weights = backbone is None and cfg.init.checkpoint is None
    pretrained = pretrained_weights(cfg.model.backbone) if start_weights else None
    if cfg.init.checkpoint is not None:
        described = f"checkpoint {cfg.init.checkpoint}"
    elif backbone is not None:
        described = f"module {type(backbone).__name__} (its own weights)"
    elif pretrained is not None:
        described = f"pretrained weights {cfg.model.backbone}"
    else:
        described = f"random initialisation of {cfg.model.backbone} (seed {cfg.training.seed})"
    return {"from": described, "checkpoint": cfg.init.checkpoint, "pretrained": pretrained,
            "module": None if backbone is None else type(backbone).__name__,
            "backbone_sha256": state_dict_digest(method.backbone)}


def _split(cfg: RunConfig, run: RunDir, is_main: bool, images: Any) -> dict[str, Any] | None:
    """The run's validation split, written by the main process, checked against the saved one
    on a resume."""
    if cfg.data.val_split is None:
        return None
    split = holdout(cfg, images)
    assert split is not None
    saved = run.read_val_split()
    if saved is not None and (saved["train"], saved["val"]) != (split["train"], split["val"]):
        raise ValueError(f"{run.val_split} holds another validation split than this "
                         "configuration draws (data set, data.limit, data.val_split or "
                         "data.val_seed changed); use a new run directory")
    if saved is None and is_main:
        run.write_val_split(split)
    return split
