"""The resume state of a run: what the trainer writes into ``checkpoint.pt`` besides the weights
(:func:`checkpoint_state`; the format is :mod:`e2mc.training.checkpointing`'s) and how a run
directory's checkpoint is read back into the trainer's objects (:func:`resume`), so that a run
killed at any point and started again trains bit-identically to an uninterrupted one."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from e2mc.artifacts import RunDir
from e2mc.config import RunConfig
from e2mc.distributed import Runtime, gather_objects
from e2mc.training.callbacks import Callback
from e2mc.training.checkpointing import (
    load_optimizer_state_keep_hyperparameters,
    load_resume_checkpoint,
    rng_state,
    set_rng_state,
)


def checkpoint_state(*, method: nn.Module, addon: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, cfg: RunConfig, runtime: Runtime,
                     callbacks: Sequence[Callback], base_epoch: int, run_epoch: int, step: int,
                     batch_in_epoch: int, skipped: int, data: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The entries of ``checkpoint.pt`` besides the model (collective under DDP: the RNG
    states and the method's training states of every process)."""
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
    """The callbacks' states of a checkpoint by callback name. A checkpoint written before
    keep-best was a callback of its own holds its state inside the monitor's
    (``monitor.keep_best``, beside the monitor's ``history``): it is handed to ``keep_best``."""
    states = dict(saved)
    monitor = states.get("monitor") or {}
    if "keep_best" not in states and monitor.get("keep_best"):
        states["keep_best"] = {**monitor["keep_best"], "history": monitor.get("history", [])}
    return states


@dataclass
class Resumed:
    """Where a run resumes: its position, its base epoch, the method's training state of this
    process (applied when the epoch is entered) and the checkpoint read."""

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
    """Load ``run``'s checkpoint, if it has one, into the trainer's objects (weights, optimizer,
    scaler, add-on, callbacks, random generators) and return where it was; None for a fresh
    start (then ``prepare_optimizer`` gets the optimizer). The main process removes the
    partial files of killed atomic writes and cuts ``metrics.jsonl`` back to the checkpoint's
    step (to nothing on a fresh start)."""
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
    # the momentum buffers of the checkpoint with this configuration's hyperparameters
    # (equal unless --override-config changed them)
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
