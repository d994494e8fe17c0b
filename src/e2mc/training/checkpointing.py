"""Training checkpoints: a project checkpoint (:func:`e2mc.checkpoints.save_checkpoint`) plus
everything needed to resume bit-identically (:func:`checkpoint_state` lists the entries; all
load with ``weights_only=True``); :func:`resume` reads them back, :func:`check_resume_config`
and :func:`check_resume_data` guard a resume.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from e2mc.artifacts import RunDir
from e2mc.config import RunConfig, config_differences
from e2mc.distributed import Runtime, gather_objects
from e2mc.training.callbacks import Callback

RESUME_KEYS = ("optimizer", "run_epoch", "step", "batch_in_epoch", "rng", "run_config")


def rng_state() -> dict[str, Any]:
    """The generator states of python, numpy, torch (CPU) and every CUDA device."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys).copy()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA states only where devices match)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def load_resume_checkpoint(path: str | Path, method_name: str) -> dict[str, Any]:
    """Read a training checkpoint for resuming; ``ValueError`` when it is not a resumable e2mc
    checkpoint or another method's."""
    from e2mc.checkpoints import torch_load

    path = Path(path)
    ckpt = torch_load(path)  # the one reader: a damaged file is a CorruptFileError naming it
    if not isinstance(ckpt, dict) or ckpt.get("format") != "e2mc":
        raise ValueError(f"{path} is not an e2mc training checkpoint")
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise ValueError(f"{path} cannot be resumed: it lacks {', '.join(missing)}")
    if ckpt.get("method") != method_name:
        raise ValueError(f"{path} was written by a {ckpt.get('method')!r} run; this run trains "
                         f"{method_name!r} (use another run directory)")
    return ckpt


def load_optimizer_state_keep_hyperparameters(optimizer: torch.optim.Optimizer,
                                              state: dict[str, Any]) -> None:
    """Load the per-parameter state (momentum buffers) of ``state``, keeping ``optimizer``'s own
    hyperparameters (lr, weight decay)."""
    ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as err:
        raise ValueError(f"the starting checkpoint's optimizer state does not fit this optimizer "
                         f"({err}); set init.load_optimizer=false to start with a fresh "
                         f"optimizer state") from err
    for group, hyper in zip(optimizer.param_groups, ours, strict=True):
        group.update(hyper)


# --------------------------------------------------------------------------- resume checks
#: Keys that may differ on resume: none changes what a step computes (``training.epochs``
#: re-lays a cosine schedule over the new total). Differences are recorded all the same.
RESUME_FREE_KEYS = frozenset({
    "training.epochs", "training.max_steps", "training.progress", "training.device",
    "training.cpu_threads", "training.log_every", "training.checkpoint_every_steps",
    "training.keep_epoch_checkpoints", "training.skip_nonfinite", "training.channels_last",
    "training.find_unused_parameters", "data.num_workers", "init.trust",
    "training.compile", "training.preempt_signals", "training.requeue", "logging.tensorboard",
    "data.skip_corrupt",
    # how the images are named: what they are is their content identity (check_resume_data)
    "data.dataset",
})
#: Keys that cannot change within a run directory, not even with ``--override-config``
#: (``monitor.keep_best``: another metric would be compared with the old metric's best).
RESUME_FIXED_KEYS = ("mode", "model.", "method.name", "training.batch_size", "data.split",
                     "data.limit", "data.val_split", "data.val_seed", "monitor.keep_best")


def read_checkpoint_record(path: str | Path) -> tuple[dict[str, Any], int, dict[str, Any] | None]:
    """``(run_config, step, data identity or None)`` of a checkpoint, without loading tensors."""
    from e2mc.checkpoints import torch_load
    from e2mc.errors import CorruptFileError

    try:
        ckpt = torch_load(path, mmap=True)
        return ckpt["run_config"], int(ckpt["step"]), ckpt.get("data")
    except Exception as err:  # noqa: BLE001 - any failure means the file is not usable
        raise CorruptFileError(f"cannot read the run's checkpoint {path} ({err}); delete it to "
                               "start the run again") from err


def check_resume_data(run_dir: str | Path, identity: dict[str, Any], new: dict[str, Any],
                      override: bool = False, overridable: bool = True
                      ) -> tuple[int, dict[str, Any]] | None:
    """Compare the content identity of the images a run resumes on with its checkpoint's.

    Other images are a :class:`~e2mc.errors.ConfigMismatchError` unless ``override`` or
    ``data.skip_corrupt`` was turned on for this resume. Returns the accepted change
    ``(first step with the new images, the checkpoint's identity)``, or None when the same
    (or the checkpoint records no identity)."""
    from e2mc.data.identity import describe_change, same_data
    from e2mc.errors import ConfigMismatchError

    run = RunDir(run_dir)
    if not run.checkpoint.is_file():
        return None
    saved_config, step, saved = read_checkpoint_record(run.checkpoint)
    if saved is None or same_data(saved, identity):
        return None
    turned_on = new["data"].get("skip_corrupt") and not saved_config["data"].get("skip_corrupt")
    if not (override or turned_on):
        raise ConfigMismatchError(
            f"{run.root}: the training images changed since its checkpoint at step {step} "
            f"({describe_change(saved, identity)}); resume on the same images, " + (
                "use a new run directory, or pass --override-config to go on with these "
                f"images from step {step + 1} (recorded in the run directory)" if overridable
                else "or use a new directory (e2mc search: another --out)"))
    return step + 1, saved


def check_resume_config(run_dir: str | Path, new: dict[str, Any], override: bool = False,
                        overridable: bool = True) -> tuple[int, dict[str, tuple[Any, Any]]]:
    """Compare ``new`` (``RunConfig.to_dict()``) with the configuration of ``run_dir``'s checkpoint.

    A difference outside :data:`RESUME_FREE_KEYS` is a :class:`~e2mc.errors.ConfigMismatchError`
    unless ``override``; one in :data:`RESUME_FIXED_KEYS` is one even then. Returns ``(first
    step with the differences, the differences)``, ``(0, {})`` without a checkpoint.
    ``overridable`` False: the refusal does not offer ``--override-config``."""
    from e2mc.errors import ConfigMismatchError

    run = RunDir(run_dir)
    if not run.checkpoint.is_file():
        return 0, {}
    saved, step, _ = read_checkpoint_record(run.checkpoint)
    _, changed = config_differences(new, saved, whole_params=True)
    changes = {key: (old, value) for key, old, value in sorted(changed)}
    if not changes:
        return step + 1, changes

    def listing(keys: list[str]) -> str:
        return "; ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in keys)

    fixed = [k for k in changes if any(k == f or (f.endswith(".") and k.startswith(f))
                                       for f in RESUME_FIXED_KEYS)]
    if fixed:
        raise ConfigMismatchError(
            f"{run.root} was trained with another configuration, and these keys cannot change "
            f"within a run: {listing(fixed)}; use a new run directory")
    guarded = [k for k in changes if k not in RESUME_FREE_KEYS]
    if guarded and not override:
        raise ConfigMismatchError(
            f"{run.root} was trained with another configuration ({run.checkpoint}, step "
            f"{step}): {listing(guarded)}. " + (
                "Resume with the same settings, use a new run directory, or pass "
                f"--override-config to apply the change from step {step + 1} (recorded in "
                "the run directory)" if overridable else
                "Use the same settings, or a new directory for these (e2mc search: another "
                "--out)"))
    return step + 1, changes


# --------------------------------------------------------------------------- resume state
def checkpoint_state(*, method: nn.Module, addon: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, cfg: RunConfig, runtime: Runtime,
                     callbacks: Sequence[Callback], base_epoch: int, run_epoch: int, step: int,
                     batch_in_epoch: int, skipped: int, data: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The entries of ``checkpoint.pt`` besides the model (collective under DDP)."""
    rngs: list[Any] = [rng_state()]
    method_states: list[Any] = [method.training_state()]
    if runtime.distributed:  # per-process states (RNG, SwAV's queue shard)
        rngs, method_states = zip(*gather_objects((rngs[0], method_states[0])), strict=True)
    return {
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
        "epoch": base_epoch + run_epoch, "run_epoch": run_epoch, "step": step,
        "batch_in_epoch": batch_in_epoch, "base_epoch": base_epoch,
        "skipped_steps": skipped, "rng": list(rngs),
        "training_state": method_states[0], "training_states": list(method_states),
        "addon": {"name": cfg.addon.name, "state": addon.state_dict()},
        "run_config": cfg.to_dict(), "world_size": runtime.world_size,
        "callbacks": {cb.name: cb.state_dict() for cb in callbacks},
        "data": data,  # the content identity of the training images (e2mc.data.identity)
    }


def callback_states(saved: dict[str, Any]) -> dict[str, Any]:
    """The callbacks' states by name; an older checkpoint's ``monitor.keep_best`` (with the
    monitor's ``history``) is handed to ``keep_best``."""
    states = dict(saved)
    monitor = states.get("monitor") or {}
    if "keep_best" not in states and monitor.get("keep_best"):
        states["keep_best"] = {**monitor["keep_best"], "history": monitor.get("history", [])}
    return states


@dataclass
class Resumed:
    """Where a run resumes, and this process's method training state (applied on entering
    the epoch)."""

    run_epoch: int
    step: int
    batch_in_epoch: int
    skipped: int
    base_epoch: int
    training_state: dict[str, Any]
    path: Path


def resume(run: RunDir, *, method: nn.Module, addon: nn.Module,
           optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, cfg: RunConfig,
           runtime: Runtime, callbacks: Sequence[Callback], base_epoch: int,
           prepare_optimizer: Callable[[torch.optim.Optimizer], None] | None = None
           ) -> Resumed | None:
    """Load ``run``'s checkpoint into the trainer's objects and return where it was; None for a
    fresh start (then ``prepare_optimizer`` gets the optimizer). The main process removes
    partial files of killed writes and cuts ``metrics.jsonl`` back to the checkpoint's step."""
    path = run.checkpoint
    if runtime.is_main:
        for stale in run.stale_temp_files():  # partial files of killed atomic writes
            stale.unlink(missing_ok=True)
            print(f"removed {stale} (left by an interrupted write)", file=sys.stderr)
    if not path.exists():
        if prepare_optimizer is not None:
            prepare_optimizer(optimizer)
        if runtime.is_main:  # a run killed before its first checkpoint starts again
            run.truncate_metrics(-1)
        return None
    ckpt = load_resume_checkpoint(path, getattr(method, "name", ""))
    method.load_state_dict(ckpt["model"], strict=True)
    states = ckpt.get("training_states") or [ckpt.get("training_state") or {}]
    own_state = states[runtime.rank] if len(states) == runtime.world_size else states[0]
    load_optimizer_state_keep_hyperparameters(optimizer, ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    addon_state = ckpt.get("addon", {}).get("state")
    if addon_state and ckpt.get("addon", {}).get("name") == cfg.addon.name:
        addon.load_state_dict(addon_state)
    saved_callbacks = callback_states(ckpt.get("callbacks", {}))
    for cb in callbacks:
        if cb.name in saved_callbacks:
            cb.load_state_dict(saved_callbacks[cb.name])
    rngs = ckpt["rng"]
    set_rng_state(rngs[runtime.rank] if len(rngs) == runtime.world_size else rngs[0])
    if runtime.is_main:
        run.truncate_metrics(int(ckpt["step"]))
        print(f"resuming from {path}: epoch {ckpt['run_epoch']}, "
              f"batch {ckpt['batch_in_epoch']}, step {ckpt['step']}", file=sys.stderr)
    return Resumed(run_epoch=int(ckpt["run_epoch"]), step=int(ckpt["step"]),
                   batch_in_epoch=int(ckpt["batch_in_epoch"]),
                   skipped=int(ckpt.get("skipped_steps", 0)),
                   base_epoch=int(ckpt.get("base_epoch", base_epoch)),
                   training_state=own_state, path=path)
