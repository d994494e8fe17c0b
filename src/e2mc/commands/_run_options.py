"""The options and the body shared by ``e2mc continue`` and ``e2mc pretrain``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from e2mc.config import RunConfig, load_config, preset_names


def register_run_command(subparsers: argparse._SubParsersAction, mode: str, help: str,
                         description: str) -> None:
    """Add ``e2mc continue`` or ``e2mc pretrain`` (``mode``) with :func:`run_command`."""
    parser = subparsers.add_parser(mode, help=help, description=description)
    add_run_arguments(parser, mode)
    parser.set_defaults(func=lambda args: run_command(args, mode),
                        libraries=("e2mc.training.run",))


def add_run_arguments(parser: argparse.ArgumentParser, mode: str) -> None:
    """The options shared by ``e2mc continue`` and ``e2mc pretrain``."""
    parser.add_argument("--config", required=True,
                        help=f"preset name or YAML file; presets: {', '.join(preset_names())}")
    parser.add_argument("--out", dest="run_dir", required=True, type=Path, metavar="DIR",
                        help="run directory (config.yaml, metrics.jsonl, checkpoints); running "
                             "the same command again resumes from its checkpoint")
    if mode == "continue":
        parser.add_argument("--from", dest="init_checkpoint", metavar="CHECKPOINT",
                            help="official (VICReg, SwAV, SimSiam), e2mc or backbone-only "
                                 "checkpoint to start from: a file, a run directory, "
                                 "builtin:demo-vicreg (shipped) or an http(s):// or file:// "
                                 "URL (downloaded once into torch.hub's cache; append "
                                 "#sha256=HEX to check it) (init.checkpoint); without it, "
                                 "continue starts from the pretrained weights --backbone names "
                                 "(default: the preset's init.checkpoint)")
    parser.add_argument("--data", metavar="DATA",
                        help="training data set: builtin, an IDX folder, an image folder, an "
                             ".npz file (data.dataset; default: the preset's)")
    add_training_arguments(parser, mode)
    parser.add_argument("--seed", type=int, metavar="N",
                        help="training seed: random initial weights, data order, views "
                             "(training.seed; default: the preset's, 0)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar (training.progress=false)")
    parser.add_argument("--override-config", action="store_true",
                        help="resume a run directory with a configuration that differs from "
                             "its checkpoint's; the change is recorded in "
                             "config_changes.jsonl with the step it takes effect")
    parser.add_argument("--val-split", type=float, metavar="FRACTION_OR_COUNT",
                        help="hold out this fraction (or number) of the training images for "
                             "validation; training never sees them (data.val_split; default: "
                             "none held out)")
    parser.add_argument("--keep-best", metavar="METRIC",
                        help="keep the step with the best validation METRIC as best.pt, step 0 "
                             "included: val/knn, val/linear_1%%, val/linear_100%%, val/rankme, "
                             "val/entropy (monitor.keep_best; needs --val-split; default: none, "
                             "the last step is the run's answer)")
    parser.add_argument("--patience", type=int, metavar="N",
                        help="with --keep-best: stop after N evaluations without improvement "
                             "(monitor.patience; default: no early stop)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config key, e.g. "
                                                  "--set training.batch_size=256 (repeatable)")


#: The options of :func:`add_training_arguments` and their config keys (a flag: ``KEY=true``).
TRAINING_KEYS = {"new_heads": "init.new_heads", "trust": "init.trust",
                 "backbone": "model.backbone", "epochs": "training.epochs",
                 "device": "training.device", "skip_nonfinite": "training.skip_nonfinite",
                 "skip_corrupt": "data.skip_corrupt", "monitor_every": "monitor.every"}


def add_training_arguments(parser: argparse.ArgumentParser, mode: str) -> None:
    """The run options ``continue``, ``pretrain`` and ``search`` share (:data:`TRAINING_KEYS`)."""
    if mode == "continue":
        parser.add_argument("--new-heads", action="store_true",
                            help="allow a backbone-only checkpoint: the projector (and "
                                 "predictor) start from random weights (init.new_heads)")
        parser.add_argument("--trust-checkpoint", dest="trust", action="store_true",
                            help="allow pickled objects when loading the starting checkpoint "
                                 "(only for files you trust)")
    weights = ("WEIGHTS and TAG name pretrained weights, loaded through the library's cache "
               + ("(not with --from)" if mode == "continue" else "(the run starts from them)"))
    parser.add_argument("--backbone", metavar="NAME",
                        help="backbone by name: resnet50, torchvision:resnet50[:WEIGHTS], "
                             "timm:NAME[.TAG] (extra [timm]), hf:REPO_ID (extra [hf]) "
                             f"(model.backbone; default: the preset's); {weights}")
    parser.add_argument("--epochs", type=int, metavar="N",
                        help=("continued epochs, counted from the starting checkpoint"
                              if mode == "continue" else "epochs of pre-training")
                        + " (training.epochs; default: the preset's)")
    parser.add_argument("--device", metavar="DEVICE",
                        help="training device: cpu, cuda, cuda:1 or auto (training.device; "
                             "default: the preset's, auto: cuda when there is one, else cpu)")
    parser.add_argument("--skip-nonfinite", action="store_true",
                        help="skip steps whose loss, gradients or updated weights are NaN/inf "
                             "or exploded (counted; the step's update is undone) instead of "
                             "stopping with exit code 3")
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="skip unreadable images of an image folder (counted)")
    parser.add_argument("--monitor-every", type=int, metavar="STEPS",
                        help="evaluate on the validation split every STEPS steps (default: every "
                             "epoch), at step 0 and at the end (monitor.every; needs "
                             "--val-split)")


def training_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides of the options of :func:`add_training_arguments` that were given."""
    out = []
    for dest, key in TRAINING_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None and value is not False and value != "":  # (0 == False: kept)
            out.append(f"{key}={'true' if value is True else value}")
    return out


def config_from_args(args: argparse.Namespace, mode: str) -> RunConfig:
    """Preset + ``--set`` + the options, validated; ``--seed`` must agree with the ``--set``."""
    from e2mc.checkpoints import check_model_input
    from e2mc.errors import InputError

    seed = getattr(args, "seed", None)
    # --seed before the --set overrides: a different training.seed there shows in the result
    overrides = [f"mode={mode}", *([f"training.seed={seed}"] if seed is not None else []),
                 *args.overrides]
    if getattr(args, "init_checkpoint", None):
        overrides.append(f"init.checkpoint={args.init_checkpoint}")
    overrides += training_overrides(args)
    if args.data:
        overrides.append(f"data.dataset={args.data}")
    if getattr(args, "quiet", False):
        overrides.append("training.progress=false")
    for option, key in (("val_split", "data.val_split"), ("keep_best", "monitor.keep_best"),
                        ("patience", "monitor.patience")):
        if getattr(args, option) is not None:
            overrides.append(f"{key}={getattr(args, option)}")
    cfg = load_config(args.config, overrides)
    if seed is not None and cfg.training.seed != seed:
        raise InputError(f"--seed {seed} and --set training.seed={cfg.training.seed} disagree; "
                         "give the training seed once")
    check_model_input(cfg, cfg.init.checkpoint)
    return cfg


def run_command(args: argparse.Namespace, mode: str) -> int:
    """Body of ``e2mc continue`` / ``e2mc pretrain``: 0, or 75 when a pre-emption signal
    stopped the run (also one during start-up: signals are caught from the start, so the
    process is not killed); errors end through :func:`e2mc.cli.main`."""
    from e2mc.distributed import is_main_process
    from e2mc.files import check_writable_dir
    from e2mc.training.preemption import (
        DEFAULT_SIGNALS,
        PREEMPTED_EXIT_CODE,
        PreemptedAtStart,
        PreemptionHandler,
        is_preemption,
        requeue_slurm_job,
        wants_requeue,
    )
    from e2mc.training.run import run_training

    guard = PreemptionHandler(DEFAULT_SIGNALS).install()
    cfg: RunConfig | None = None
    try:
        cfg = config_from_args(args, mode)
        guard.retarget(cfg.training.preempt_signals)
        check_writable_dir(args.run_dir, "run directory")
        if guard.requested and os.environ.get("WORLD_SIZE", "1") == "1":
            raise PreemptedAtStart(guard.received)  # (several processes decide together)
        result = run_training(cfg, args.run_dir, override_config=args.override_config)
    except PreemptedAtStart as stop:
        print(f"stopped ({stop}): nothing was trained in this invocation; run the same "
              "command again to start or resume", file=sys.stderr)
        if cfg is not None and cfg.training.requeue and is_main_process() \
                and wants_requeue(guard.received):
            requeue_slurm_job()
        return PREEMPTED_EXIT_CODE
    finally:
        guard.uninstall()
        _destroy_process_group()
    state = "done" if result.completed else f"stopped ({result.stop_reason})"
    print(f"{state}: epoch {result.run_epoch}/{cfg.training.epochs}, step {result.step}, "
          f"{result.skipped_steps} skipped step(s); checkpoint {result.checkpoint}",
          file=sys.stderr)
    if is_preemption(result.stop_reason):  # run the same command again to resume
        return PREEMPTED_EXIT_CODE
    return 0


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
