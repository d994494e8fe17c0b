"""From a :class:`RunConfig` to a finished run: build the method, add-on and data, load the
starting checkpoint, train. Used by ``e2mc continue`` and ``e2mc pretrain``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2mc.training.config import RunConfig, load_config, preset_names


def build_method_from_config(cfg: RunConfig) -> Any:
    """``e2mc.methods.build_method(name, backbone=..., small_images=..., in_channels=...,
    **method.params)``."""
    from e2mc.methods import build_method

    return build_method(cfg.method.name, **method_kwargs(cfg))


def build_addon_from_config(cfg: RunConfig, method: Any) -> Any:
    """``e2mc.addons.build_addon(name, **addon.params)``; for ``e2mc`` the compact space defaults
    to the method's and ``batch_size_for_cov`` to the global batch size (as the authors ran it)."""
    from e2mc.addons import build_addon

    params = dict(cfg.addon.params)
    if cfg.addon.name == "e2mc":
        params.setdefault("space", method.compact_space)
        params.setdefault("batch_size_for_cov", cfg.training.batch_size)
    return build_addon(cfg.addon.name, **params)


def build_train_dataset(cfg: RunConfig, method: Any) -> Any:
    """The training images with the method's view recipe (or ``data.recipe``)."""
    from torch.utils.data import Subset

    from e2mc.data import MultiViewDataset, build_dataset, build_views

    if cfg.data.dataset is None:
        raise ValueError("data.dataset is not set: give a data set ('builtin', an IDX folder, an "
                         "image folder or an .npz file) with --data or --set data.dataset=...")
    base = build_dataset(cfg.data.dataset, cfg.data.split, transform=None,
                         skip_corrupt=cfg.data.skip_corrupt)
    skipped = int(getattr(base, "num_skipped", 0))
    if cfg.data.limit is not None:
        if cfg.data.limit < 1:
            raise ValueError(f"data.limit must be >= 1, got {cfg.data.limit}")
        base = Subset(base, range(min(cfg.data.limit, len(base))))
    views = build_views(cfg.data.recipe or method.view_recipe, cfg.data.image_size,
                        cfg.data.channels)
    dataset = MultiViewDataset(base, views)
    dataset.num_skipped = skipped  # unreadable images dropped by --skip-corrupt
    return dataset


def method_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Keyword arguments of ``build_method`` (besides the name) from the config."""
    return {"backbone": cfg.model.backbone, "small_images": cfg.model.small_images,
            "in_channels": cfg.model.in_channels, **cfg.method.params}


def load_start(cfg: RunConfig) -> tuple[Any, int, Callable[[Any], None] | None]:
    """The starting model of a run: ``init.checkpoint`` loaded strictly (an official VICReg /
    SwAV / SimSiam file through ``e2mc.checkpoints.load_official``, or a project checkpoint of
    the same method), else fresh weights (``pretrain`` only).

    Returns ``(method, base_epoch, prepare_optimizer)``: ``base_epoch`` is ``init.base_epoch``
    if set, else the checkpoint's epoch (0 without one); ``prepare_optimizer`` restores the
    checkpoint's optimizer state (momentum) into a new optimizer when it has one and
    ``init.load_optimizer`` is true.
    """
    from e2mc.checkpoints import (
        PROJECT_FORMAT,
        load_official,
        restore_optimizer_state,
        torch_load,
    )
    from e2mc.checkpoints.strict import check_keys
    from e2mc.training.checkpointing import load_optimizer_state_keep_hyperparameters

    if cfg.init.checkpoint is None:
        if cfg.mode == "continue":
            raise ValueError("continue needs a starting checkpoint: --from PATH "
                             "(or --set init.checkpoint=PATH)")
        return build_method_from_config(cfg), cfg.init.base_epoch or 0, None
    path = Path(cfg.init.checkpoint)
    if not path.is_file():
        raise ValueError(f"starting checkpoint {path} does not exist")
    obj = torch_load(path, trust=cfg.init.trust)
    prepare: Callable[[Any], None] | None = None
    if isinstance(obj, dict) and obj.get("format") == PROJECT_FORMAT:
        if obj.get("method") != cfg.method.name:
            raise ValueError(f"{path} holds a {obj.get('method')!r} model; this run trains "
                             f"{cfg.method.name!r}")
        method = build_method_from_config(cfg)
        check_keys(method.state_dict(), obj["model"], f"e2mc ({cfg.method.name})")
        method.load_state_dict(obj["model"], strict=True)
        epoch, opt_state = obj.get("epoch"), obj.get("optimizer")
        if opt_state is not None:
            def prepare(optimizer: Any) -> None:
                load_optimizer_state_keep_hyperparameters(optimizer, opt_state)
    else:
        method, info = load_official(obj, method=cfg.method.name, trust=cfg.init.trust,
                                     **method_kwargs(cfg))
        epoch, opt_state = info.get("epoch"), info.get("optimizer")
        if opt_state is not None:
            def prepare(optimizer: Any) -> None:
                restore_optimizer_state(optimizer, method, opt_state)
    if not cfg.init.load_optimizer:
        prepare = None
    base_epoch = cfg.init.base_epoch if cfg.init.base_epoch is not None else int(epoch or 0)
    return method, base_epoch, prepare


def run_training(cfg: RunConfig, run_dir: str | Path) -> Any:
    """Build everything from ``cfg`` and train in ``run_dir`` (resuming if it holds a
    checkpoint). Returns the :class:`~e2mc.training.trainer.TrainResult`."""
    import torch

    from e2mc.data import collate_views
    from e2mc.training.trainer import CHECKPOINT, Trainer, init_runtime

    run_dir = Path(run_dir)
    runtime = init_runtime(cfg.training.device)
    if cfg.training.cpu_threads is not None:
        torch.set_num_threads(cfg.training.cpu_threads)
    torch.manual_seed(cfg.training.seed)
    if (run_dir / CHECKPOINT).exists():  # resume: the weights come from the run's checkpoint
        method, base_epoch, prepare = build_method_from_config(cfg), 0, None
    else:
        method, base_epoch, prepare = load_start(cfg)
    addon = build_addon_from_config(cfg, method)
    dataset = build_train_dataset(cfg, method)
    if runtime.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(cfg.to_yaml(), encoding="utf-8")
        print(f"{cfg.mode} {cfg.name}: {cfg.method.name} + add-on {cfg.addon.name}, "
              f"{len(dataset)} images ({dataset.num_skipped} unreadable skipped), "
              f"batch {cfg.training.batch_size} over "
              f"{runtime.world_size} process(es) on {runtime.device}, lr {cfg.lr:g}, "
              f"{cfg.training.epochs} epoch(s), run directory {run_dir}", file=sys.stderr)
    trainer = Trainer(method, addon, dataset, cfg, run_dir, runtime=runtime,
                      base_epoch=base_epoch, collate_fn=collate_views,
                      prepare_optimizer=prepare)
    return trainer.fit()


# --------------------------------------------------------------------------- command line
def add_run_arguments(parser: argparse.ArgumentParser, mode: str) -> None:
    """The options shared by ``e2mc continue`` and ``e2mc pretrain``."""
    parser.add_argument("--config", required=True,
                        help=f"preset name or YAML file; presets: {', '.join(_safe_presets())}")
    parser.add_argument("--run-dir", required=True, type=Path,
                        help="run directory (config.yaml, metrics.jsonl, checkpoints); running "
                             "the same command again resumes from its checkpoint")
    if mode == "continue":
        parser.add_argument("--from", dest="init_checkpoint", metavar="CHECKPOINT",
                            help="official (VICReg, SwAV, SimSiam) or e2mc checkpoint to start "
                                 "from (init.checkpoint)")
        parser.add_argument("--trust-checkpoint", dest="trust", action="store_true",
                            help="allow pickled objects when loading the starting checkpoint "
                                 "(only for files you trust)")
    parser.add_argument("--data", help="training data set (data.dataset)")
    parser.add_argument("--epochs", type=int,
                        help="epochs of this run (for continue: continued epochs)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 or auto (training.device)")
    parser.add_argument("--skip-nonfinite", action="store_true",
                        help="skip steps whose loss is NaN/inf (counted) instead of stopping")
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="skip unreadable images of an image folder (counted)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key, e.g. "
                                                  "--set training.batch_size=256 (repeatable)")


def config_from_args(args: argparse.Namespace, mode: str) -> RunConfig:
    """Preset + ``--set`` overrides + the dedicated options, validated."""
    overrides = [f"mode={mode}", *args.overrides]
    if getattr(args, "init_checkpoint", None):
        overrides.append(f"init.checkpoint={args.init_checkpoint}")
    if getattr(args, "trust", False):
        overrides.append("init.trust=true")
    if args.data:
        overrides.append(f"data.dataset={args.data}")
    if args.epochs is not None:
        overrides.append(f"training.epochs={args.epochs}")
    if args.device:
        overrides.append(f"training.device={args.device}")
    if args.skip_nonfinite:
        overrides.append("training.skip_nonfinite=true")
    if args.skip_corrupt:
        overrides.append("data.skip_corrupt=true")
    return load_config(args.config, overrides)


def run_command(args: argparse.Namespace, mode: str) -> int:
    """Body of ``e2mc continue`` / ``e2mc pretrain``: exit 0 when done, 1 when stopped by a
    non-finite loss, 2 for a bad configuration, data set or checkpoint."""
    from e2mc.training.trainer import NonFiniteLossError

    try:
        cfg = config_from_args(args, mode)
        result = run_training(cfg, args.run_dir)
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as err:  # OSError: missing or corrupt files
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        _destroy_process_group()
    state = "done" if result.completed else "stopped"
    print(f"{state}: epoch {result.run_epoch}/{cfg.training.epochs}, step {result.step}, "
          f"{result.skipped_steps} skipped step(s); checkpoint {result.checkpoint}",
          file=sys.stderr)
    return 0


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _safe_presets() -> list[str]:
    try:
        return preset_names()
    except (FileNotFoundError, ModuleNotFoundError):  # pragma: no cover - broken install
        return []
