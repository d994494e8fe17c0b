"""The training loop: base loss + add-on, AMP, DDP, logging, checkpoints, exact resume.

One loop serves ``e2mc continue`` (the paper's step 2, docs/method.md) and ``e2mc pretrain``. The
trainer only knows the :class:`~e2mc.methods.SSLMethod` interface and an add-on called as
``addon(embeddings) -> {"loss": ..., <term>: ...}``; it never knows which ones it runs.
"""

from __future__ import annotations

import io
import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from e2mc.artifacts import CHECKPOINT, RunDir
from e2mc.config import RunConfig
from e2mc.errors import NonFiniteError
from e2mc.optim import lr_factor
from e2mc.training.callbacks import Callback
from e2mc.training.checkpointing import (
    load_optimizer_state_keep_hyperparameters,
    load_training_checkpoint,
    rng_state,
    save_training_checkpoint,
    set_rng_state,
)
from e2mc.training.logging import MetricsLogger
from e2mc.training.sampling import EpochBatchSampler, SeededSamples, collate_views

__all__ = ["CHECKPOINT", "NonFiniteLossError", "Runtime", "TrainResult", "Trainer",
           "init_runtime", "lr_factor"]


class NonFiniteLossError(NonFiniteError):
    """A loss term, a gradient or a weight became NaN or infinite (or a weight exploded past
    :data:`EXPLODED`); the message names it, the step and the last good checkpoint."""


#: A parameter whose magnitude passes this after an update counts as exploded (a learning-rate
#: blow-up): it is treated like a non-finite value and never checkpointed.
EXPLODED = 1e8


def _max_abs(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``max |t|`` of every tensor (NaN where a tensor holds a NaN), as one float32 vector."""
    if not tensors:
        return torch.zeros(0)
    return torch.stack([t.detach().abs().amax().float() if t.numel()
                        else torch.zeros((), device=t.device) for t in tensors]).cpu()


@dataclass
class Runtime:
    """Where this process runs: device, rank, number of processes."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_runtime(device: str = "auto") -> Runtime:
    """Pick the device and, under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), join the
    process group from the environment variables: ``nccl`` on CUDA, ``gloo`` on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("training.device is cuda but no CUDA device is available")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return Runtime(device=dev, rank=rank, world_size=world_size, local_rank=local_rank)


def _gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every process, in rank order. Serialised with ``torch.save`` first (tensors
    inside ``all_gather_object`` payloads fail to unpickle) and read back weights-only."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, buffer.getvalue())
    return [torch.load(io.BytesIO(b), weights_only=True) for b in gathered]


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` did: the position reached, how it ended, the trained method."""

    run_epoch: int
    step: int
    skipped_steps: int
    completed: bool
    checkpoint: Path | None
    last_metrics: dict[str, float]
    method: nn.Module | None = None
    stop_reason: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the run reached the end its configuration sets: every epoch, or
        ``training.max_steps``, or a callback's deliberate stop (keep-best's patience). A
        pre-empted run is not finished: running it again resumes it."""
        from e2mc.training.preemption import is_preemption

        return self.completed or (self.stop_reason is not None
                                  and not is_preemption(self.stop_reason))


class Trainer:
    """Trains ``method`` (+ ``addon``) on ``dataset`` as ``cfg.training`` says, in ``run_dir``.

    ``dataset[i]`` yields the views of image ``i`` (``views`` or ``(views, label)``).
    ``base_epoch``: epochs the starting weights were trained (continued runs), added to the
    epoch and iteration numbers the method's hooks receive. If the run directory's checkpoint
    exists the run resumes from it. ``callbacks`` (:class:`~e2mc.training.callbacks.Callback`)
    see the start, every step and the end; their state is saved in the checkpoint.
    """

    def __init__(self, method: nn.Module, addon: nn.Module, dataset: Dataset, cfg: RunConfig,
                 run_dir: str | Path, runtime: Runtime | None = None, base_epoch: int = 0,
                 collate_fn: Any = None,
                 prepare_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,
                 callbacks: list[Callback] | None = None) -> None:
        self.cfg = cfg
        self.training_cfg = cfg.training
        self.run_dir = Path(run_dir)
        self.run = RunDir(run_dir)
        self.callbacks: list[Callback] = list(callbacks or [])
        self.logger: MetricsLogger | None = None
        self.postfix: dict[str, str] = {}  # extra progress-bar fields set by callbacks
        self.runtime = runtime or init_runtime(self.training_cfg.device)
        self.method = method
        self.addon = addon
        self.base_epoch = base_epoch
        self.prepare_optimizer = prepare_optimizer
        self._pending_training_state: dict[str, Any] | None = None
        self._last_good: tuple[Path, int] | None = None  # (checkpoint, step) for messages
        if self.training_cfg.precision == "fp16" and self.runtime.device.type != "cuda":
            raise ValueError("training.precision=fp16 needs CUDA; use bf16 or fp32 on CPU")
        self.sampler = EpochBatchSampler(len(dataset), self.training_cfg.batch_size,
                                         seed=self.training_cfg.seed, rank=self.runtime.rank,
                                         world_size=self.runtime.world_size)
        workers = cfg.data.num_workers
        # data.pipeline=device: the data set collates uint8 crops + parameters and names the
        # augmentation that turns them into views on the training device
        self.device_augment = getattr(dataset, "device_augment", None)
        collate_fn = getattr(dataset, "collate_fn", None) or collate_fn
        self.loader = DataLoader(
            SeededSamples(dataset), batch_sampler=self.sampler, num_workers=workers,
            collate_fn=collate_fn or collate_views, pin_memory=self.runtime.device.type == "cuda",
            persistent_workers=workers > 0)
        self._setup_model()

    # ------------------------------------------------------------------ setup
    def _setup_model(self) -> None:
        method, runtime = self.method, self.runtime
        if runtime.distributed and getattr(method, "sync_batchnorm", False):
            if runtime.device.type == "cuda":
                method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
            elif runtime.is_main:
                print("note: SyncBatchNorm needs CUDA; using per-process BatchNorm on CPU",
                      file=sys.stderr)
        method.to(runtime.device)
        self.addon.to(runtime.device)
        if self.training_cfg.channels_last:
            method.to(memory_format=torch.channels_last)
        if self.training_cfg.compile:  # in place: the state-dict keys stay those of the checkpoints
            method.backbone.compile()
        self.method = method
        self.optimizer = method.build_optimizer(lr=self.cfg.lr,
                                                weight_decay=self.cfg.optim.weight_decay,
                                                **self.cfg.optim.params)
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.scaler = torch.amp.GradScaler(runtime.device.type,
                                           enabled=self.training_cfg.precision == "fp16")
        self.model: nn.Module = method
        if runtime.distributed:
            ids = [runtime.device.index] if runtime.device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(
                method, device_ids=ids,
                find_unused_parameters=self.training_cfg.find_unused_parameters)

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (``training.max_steps`` when it is smaller)."""
        total, most = self.training_cfg.epochs * self.steps_per_epoch, self.training_cfg.max_steps
        return min(total, most) if most is not None else total

    def _autocast(self) -> Any:
        if self.training_cfg.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.training_cfg.precision == "bf16" else torch.float16
        return torch.autocast(self.runtime.device.type, dtype=dtype)

    # ------------------------------------------------------------------ checkpoints
    def _state(self, run_epoch: int, step: int, batch_in_epoch: int, skipped: int
               ) -> dict[str, Any]:
        rngs: list[Any] = [rng_state()]
        method_states: list[Any] = [self.method.training_state()]
        if self.runtime.distributed:  # per-process states (RNG, SwAV's queue shard)
            rngs, method_states = zip(*_gather_objects((rngs[0], method_states[0])),
                                      strict=True)
        return {
            "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
            "epoch": self.base_epoch + run_epoch, "run_epoch": run_epoch, "step": step,
            "batch_in_epoch": batch_in_epoch, "base_epoch": self.base_epoch,
            "skipped_steps": skipped, "rng": list(rngs),
            "training_state": method_states[0], "training_states": list(method_states),
            "addon": {"name": self.cfg.addon.name, "state": self.addon.state_dict()},
            "run_config": self.cfg.to_dict(), "world_size": self.runtime.world_size,
            "callbacks": {cb.name: cb.state_dict() for cb in self.callbacks},
        }

    def _save(self, run_epoch: int, step: int, batch_in_epoch: int, skipped: int) -> Path:
        self._refuse_bad_weights(step)
        state = self._state(run_epoch, step, batch_in_epoch, skipped)  # collective under DDP
        path = self.run.checkpoint
        if self.runtime.is_main:
            save_training_checkpoint(path, self.method, **state)
        self._last_good = (path, step)
        return path

    def _refuse_bad_weights(self, step: int, agree: bool = True) -> None:
        """Never checkpoint a non-finite or exploded state (``agree``: a collective call)."""
        bad = self._weights_problem(agree)
        if bad is not None:
            raise NonFiniteLossError(f"{bad} at step {step}; not writing a checkpoint. "
                                     f"{self._last_good_text()}")

    def _last_good_text(self) -> str:
        if self._last_good is None:
            return "No checkpoint was written yet"
        path, step = self._last_good
        return f"The last good checkpoint is {path} (step {step})"

    def save_model(self, path: Path, run_epoch: int, step: int) -> None:
        """Model-only checkpoint of the current weights (epoch copies, ``best.pt``); main
        process only, written atomically."""
        self._refuse_bad_weights(step, agree=False)  # may be called on the main process only
        if self.runtime.is_main:
            save_training_checkpoint(
                path, self.method, epoch=self.base_epoch + run_epoch, run_epoch=run_epoch,
                step=step, base_epoch=self.base_epoch, run_config=self.cfg.to_dict())

    def _save_epoch_copy(self, run_epoch: int, step: int) -> None:
        """Model-only checkpoint ``checkpoints/epoch_XXXX.pt`` (for accuracy-vs-epoch curves)."""
        if self.training_cfg.keep_epoch_checkpoints:
            self.save_model(self.run.epoch_checkpoint(run_epoch), run_epoch, step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append a record to ``metrics.jsonl`` / TensorBoard (main process; callbacks use it)."""
        if self.logger is not None:
            self.logger.log(step, metrics)

    def _resume(self) -> tuple[int, int, int]:
        """Load the run's checkpoint if present; returns ``(run_epoch, step, skipped)``."""
        path = self.run.checkpoint
        if self.runtime.is_main:
            for stale in self.run.stale_temp_files():  # partial files of killed atomic writes
                stale.unlink(missing_ok=True)
                print(f"removed {stale} (left by an interrupted write)", file=sys.stderr)
        if not path.exists():
            if self.prepare_optimizer is not None:
                self.prepare_optimizer(self.optimizer)
            if self.runtime.is_main:  # a run killed before its first checkpoint starts again
                self.run.truncate_metrics(-1)
            return 0, 0, 0
        ckpt = load_training_checkpoint(path, getattr(self.method, "name", ""))
        saved_batch = ckpt["run_config"]["training"]["batch_size"]
        if saved_batch != self.training_cfg.batch_size:
            raise ValueError(f"{path} was trained with batch size {saved_batch}, this run has "
                             f"{self.training_cfg.batch_size}; resume with the same batch size")
        self.method.load_state_dict(ckpt["model"], strict=True)
        states = ckpt.get("training_states") or [ckpt.get("training_state") or {}]
        self._pending_training_state = (states[self.runtime.rank]
                                        if len(states) == self.runtime.world_size else states[0])
        # the momentum buffers of the checkpoint with this configuration's hyperparameters
        # (equal unless --override-config changed them)
        load_optimizer_state_keep_hyperparameters(self.optimizer, ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])
        addon_state = ckpt.get("addon", {}).get("state")
        if addon_state and ckpt.get("addon", {}).get("name") == self.cfg.addon.name:
            self.addon.load_state_dict(addon_state)
        self.base_epoch = int(ckpt.get("base_epoch", self.base_epoch))
        saved_callbacks = ckpt.get("callbacks", {})
        for cb in self.callbacks:
            if cb.name in saved_callbacks:
                cb.load_state_dict(saved_callbacks[cb.name])
        rngs = ckpt["rng"]
        set_rng_state(rngs[self.runtime.rank] if len(rngs) == self.runtime.world_size else rngs[0])
        self._last_good = (path, int(ckpt["step"]))
        if self.runtime.is_main:
            self.run.truncate_metrics(int(ckpt["step"]))
            print(f"resuming from {path}: epoch {ckpt['run_epoch']}, "
                  f"batch {ckpt['batch_in_epoch']}, step {ckpt['step']}", file=sys.stderr)
            self._complete_epoch_copies(int(ckpt["run_epoch"]), int(ckpt["batch_in_epoch"]),
                                        int(ckpt["step"]))
        return int(ckpt["run_epoch"]), int(ckpt["step"]), int(ckpt.get("skipped_steps", 0))

    def _complete_epoch_copies(self, run_epoch: int, batch_in_epoch: int, step: int) -> None:
        """After a resume: write the epoch copy a kill interrupted (the checkpoint taken at an
        epoch's end holds the same weights) and name the ones that cannot be recreated."""
        if not self.training_cfg.keep_epoch_checkpoints:
            return
        have = {epoch for epoch, _ in self.run.epoch_checkpoints()}
        missing = [e for e in range(run_epoch + 1) if e not in have]
        if batch_in_epoch == 0 and run_epoch in missing and (run_epoch > 0 or step == 0):
            self.save_model(self.run.epoch_checkpoint(run_epoch), run_epoch, step)
            print(f"wrote the missing {self.run.epoch_checkpoint(run_epoch)}", file=sys.stderr)
            missing.remove(run_epoch)
        if missing:
            print(f"warning: {self.run.epoch_dir} lacks the copies of epoch(s) "
                  f"{', '.join(map(str, missing))}, whose weights are gone (the run was "
                  "interrupted or keep_epoch_checkpoints was off)", file=sys.stderr)

    def _enter_epoch(self, run_epoch: int, mid_epoch: bool) -> None:
        """``method.set_epoch`` and, after a resume, the method's saved training state in the
        order an uninterrupted run would have produced it: a checkpoint written mid-epoch was
        taken after ``set_epoch`` of its epoch, one written at an epoch's end before it."""
        pending, self._pending_training_state = self._pending_training_state, None
        if pending is not None and not mid_epoch:
            self.method.load_training_state(pending)
        self.method.set_epoch(self.base_epoch + run_epoch)
        if pending is not None and mid_epoch:
            self.method.load_training_state(pending)

    # ------------------------------------------------------------------ one step
    def _set_lr(self, step: int) -> float:
        total = self.training_cfg.epochs * self.steps_per_epoch
        warmup = round(self.cfg.optim.warmup_epochs * self.steps_per_epoch)
        factor = lr_factor(step, total, self.cfg.optim.schedule, warmup,
                           self.cfg.optim.final_lr_fraction)
        for group in self.optimizer.param_groups:
            if not group.get("fix_lr", False):
                group["lr"] = group["initial_lr"] * factor
        return float(self.optimizer.param_groups[0]["lr"])

    def _forward(self, views: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Base loss under autocast, add-on in float32; returns ``loss`` and the named terms."""
        with self._autocast():
            out = self.model(views)
        embeddings = out.all_embeddings if getattr(self.addon, "uses_all_views", False) \
            else out.embeddings
        with torch.autocast(self.runtime.device.type, enabled=False):
            extra = self.addon([e.float() for e in embeddings])
        base_loss = out.loss.float()
        terms: dict[str, torch.Tensor] = {"loss": base_loss + extra["loss"].float(),
                                          "base/loss": base_loss}
        terms.update({f"base/{k}": v.detach().float() for k, v in out.terms.items()})
        terms["addon/loss"] = extra["loss"]
        terms.update({f"addon/{k}": v.detach().float() for k, v in extra.items() if k != "loss"})
        return terms

    def _first_nonfinite(self, terms: dict[str, torch.Tensor]) -> str | None:
        """Name of the first non-finite term, agreed over all processes (``"?"``: another's)."""
        values = torch.stack([t.detach().float().reshape(()) for t in terms.values()])
        finite = torch.isfinite(values)
        flag = (~finite).any().to(torch.int32).reshape(1)
        if self.runtime.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not bool(flag.item()):
            return None
        bad = [name for name, ok in zip(terms, finite.tolist(), strict=True) if not ok]
        return bad[0] if bad else "a term on another process"

    def _agree(self, flag: bool) -> bool:
        """``flag`` of any process (all processes take the same decision)."""
        if not self.runtime.distributed:
            return flag
        t = torch.tensor([int(flag)], device=self.runtime.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def _nonfinite_gradient(self) -> str | None:
        """``"the gradient of NAME is not finite"`` for the first such parameter, else None."""
        named = [(n, p.grad) for n, p in self.method.named_parameters() if p.grad is not None]
        peaks = _max_abs([g for _, g in named])
        finite = torch.isfinite(peaks)
        if not self._agree(not bool(finite.all())):
            return None
        bad = [n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok]
        return f"the gradient of {bad[0] if bad else 'a parameter on another process'} is " \
               "not finite"

    def _weights_problem(self, agree: bool = True) -> str | None:
        """A non-finite parameter or buffer, or a parameter past :data:`EXPLODED`, else None."""
        params = list(self.method.named_parameters())
        buffers = [(n, b) for n, b in self.method.named_buffers() if b.is_floating_point()]
        peaks = _max_abs([t for _, t in params + buffers])
        limits = torch.tensor([EXPLODED] * len(params) + [math.inf] * len(buffers))
        ok = torch.isfinite(peaks) & (peaks <= limits)
        failed = not bool(ok.all())
        if not (self._agree(failed) if agree else failed):
            return None
        names = [n for n, _ in params + buffers]
        for i, good in enumerate(ok.tolist()):
            if not good:
                value = float(peaks[i])
                if math.isfinite(value):
                    return (f"the weights exploded ({names[i]} reached {value:.3g} > "
                            f"{EXPLODED:g}; learning rate too high?)")
                return f"{names[i]} is not finite after the update"
        return "a weight on another process is not finite"

    def _snapshot(self) -> dict[str, Any]:
        """The weights, buffers and optimizer state before a step (``--skip-nonfinite``)."""
        import copy

        return {"model": {k: v.detach().clone() for k, v in self.method.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "scaler": self.scaler.state_dict()}

    def _restore(self, snapshot: dict[str, Any]) -> None:
        self.method.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])

    def _step(self, views: list[torch.Tensor], iteration: int
              ) -> tuple[dict[str, torch.Tensor], str | None]:
        """Forward, backward, update; returns the terms and what was not finite (the loss, a
        gradient, the updated weights), if anything. With ``skip_nonfinite`` a failed step
        leaves weights, buffers and optimizer state as they were before it."""
        snapshot = self._snapshot() if self.training_cfg.skip_nonfinite else None
        terms = self._forward(views)
        bad = self._first_nonfinite(terms)
        self.optimizer.zero_grad(set_to_none=True)
        if bad is not None:
            bad = f"{bad} is not finite"
        else:
            self.scaler.scale(terms["loss"]).backward()
            if self.scaler.is_enabled():
                self.scaler.unscale_(self.optimizer)  # fp16: the scaler skips inf gradients
            self.method.after_backward(iteration)
            if not self.scaler.is_enabled():
                bad = self._nonfinite_gradient()
            if bad is None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                bad = self._weights_problem()
            self.optimizer.zero_grad(set_to_none=True)
        if bad is not None and snapshot is not None:
            self._restore(snapshot)
        return terms, bad

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        """Train until ``training.epochs`` run epochs are done (or ``training.max_steps``)."""
        training_cfg, runtime = self.training_cfg, self.runtime
        run_epoch, step, skipped = self._resume()
        if runtime.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        steps_per_epoch = self.steps_per_epoch
        start_batch = step - run_epoch * steps_per_epoch
        logger = self.logger = MetricsLogger(self.run_dir, enabled=runtime.is_main, config=self.cfg)
        ckpt_path: Path | None = self.run.checkpoint if step else None
        if step == 0 and run_epoch == 0:
            self._save_epoch_copy(0, 0)
        last: dict[str, float] = {}
        stopped = False
        stop_reason: str | None = None
        for cb in self.callbacks:
            cb.on_fit_start(self, step)
        # a re-run: nothing left to do
        if training_cfg.max_steps is not None and step >= training_cfg.max_steps:
            stopped, stop_reason = True, f"training.max_steps={training_cfg.max_steps}"
            if runtime.is_main:
                print(f"{self.run.checkpoint} is at step {step}, training.max_steps is "
                      f"{training_cfg.max_steps}: no step to take", file=sys.stderr)
        try:
            while run_epoch < training_cfg.epochs and not stopped:
                self._enter_epoch(run_epoch, mid_epoch=start_batch > 0)
                self.sampler.set_epoch(run_epoch, start_batch)
                bar = self._bar(run_epoch, start_batch)
                window_images, window_start = 0, time.perf_counter()
                self.model.train()
                for batch_idx, batch in enumerate(self.loader, start=start_batch):
                    views = batch[0] if isinstance(batch, tuple) else batch
                    iteration = self.base_epoch * steps_per_epoch + step
                    lr = self._set_lr(step)
                    self.method.before_step(iteration)
                    views = [v.to(runtime.device, non_blocking=True) for v in views]
                    if self.device_augment is not None:  # batch = (uint8 crops, parameters)
                        views = self.device_augment(views, batch[1])
                    if training_cfg.channels_last:
                        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
                    terms, bad = self._step(views, iteration)
                    if bad is not None:
                        where = f"{bad} at step {step + 1} (epoch {run_epoch}, batch {batch_idx})"
                        if not training_cfg.skip_nonfinite:
                            raise NonFiniteLossError(
                                f"{where}; stopping. {self._last_good_text()}; "
                                "--skip-nonfinite skips such steps")
                        skipped += 1
                        if runtime.is_main:
                            print(f"warning: {where}; step skipped ({skipped} so far)",
                                  file=sys.stderr)
                    step += 1
                    window_images += training_cfg.batch_size
                    if bar is not None:
                        bar.update(1)
                    if step % training_cfg.log_every == 0 or batch_idx == steps_per_epoch - 1:
                        elapsed = max(time.perf_counter() - window_start, 1e-9)
                        last = {k: float(v.item()) for k, v in terms.items()}
                        last.update(lr=lr, images_per_s=window_images / elapsed,
                                    skipped_steps=skipped)
                        logger.log(step, {"epoch": run_epoch, "batch": batch_idx, **last})
                        if bar is not None:
                            bar.set_postfix({**self._postfix(last), **self.postfix},
                                            refresh=False)
                        window_images, window_start = 0, time.perf_counter()
                    done_epoch = batch_idx == steps_per_epoch - 1
                    if done_epoch:
                        run_epoch += 1
                    if training_cfg.max_steps is not None and step >= training_cfg.max_steps:
                        stopped, stop_reason = True, f"training.max_steps={training_cfg.max_steps}"
                    for cb in self.callbacks:
                        reason = cb.on_step_end(self, step, run_epoch, terms)
                        if reason and not stopped:
                            stopped, stop_reason = True, reason
                    every = training_cfg.checkpoint_every_steps
                    if done_epoch or stopped or (every and step % every == 0):
                        ckpt_path = self._save(run_epoch, step,
                                               step - run_epoch * steps_per_epoch, skipped)
                        if done_epoch:
                            self._save_epoch_copy(run_epoch, step)
                    if stopped:
                        break
                if bar is not None:
                    bar.close()
                start_batch = 0
            result = TrainResult(run_epoch=run_epoch, step=step, skipped_steps=skipped,
                                 completed=run_epoch >= training_cfg.epochs, checkpoint=ckpt_path,
                                 last_metrics=last, method=self.method, stop_reason=stop_reason)
            for cb in self.callbacks:
                cb.on_fit_end(self, result)
        finally:
            logger.close()
            self.logger = None
            self._stop_workers()
        return result

    def _stop_workers(self) -> None:
        """Stop the DataLoader's persistent workers now. A run stopped mid-epoch (max_steps, a
        signal) leaves its iterator unfinished; its workers ignore the pre-emption signals,
        so the interpreter's exit could not terminate them and would wait for them forever."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            self.loader._iterator = None

    def _bar(self, run_epoch: int, start_batch: int) -> Any:
        if not (self.runtime.is_main and self.training_cfg.progress):
            return None
        from tqdm import tqdm

        return tqdm(total=self.steps_per_epoch, initial=start_batch, unit="step",
                    desc=f"epoch {run_epoch + 1}/{self.training_cfg.epochs}", file=sys.stderr,
                    dynamic_ncols=True, mininterval=1.0)

    @staticmethod
    def _postfix(metrics: dict[str, float]) -> dict[str, str]:
        shown = {"img/s": f"{metrics['images_per_s']:.0f}", "loss": f"{metrics['loss']:.4g}"}
        for key in ("base/loss", "addon/loss"):
            shown[key.split("/")[0]] = f"{metrics[key]:.4g}"
        return shown
