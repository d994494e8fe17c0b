"""The training loop of ``e2mc continue`` and ``e2mc pretrain``: base loss + add-on, AMP, DDP,
logging, checkpoints, exact resume. It knows only the :class:`~e2mc.methods.SSLMethod`
interface and an add-on ``addon(embeddings) -> {"loss": ..., <term>: ...}``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from e2mc.artifacts import RunDir
from e2mc.checkpoints import save_checkpoint
from e2mc.config import RunConfig
from e2mc.data import collate_views
from e2mc.distributed import Runtime, init_runtime
from e2mc.optim import set_scheduled_lr, set_scheduled_weight_decay
from e2mc.processes import loader_options
from e2mc.training.callbacks import Callback
from e2mc.training.checkpointing import checkpoint_state, resume
from e2mc.training.epoch_copies import EpochCopies
from e2mc.training.estimate import RunEstimate
from e2mc.training.hardware import Choice, chosen, hardware_choices
from e2mc.training.logging import MetricsLogger
from e2mc.training.nonfinite import NonFiniteGuard, NonFiniteLossError
from e2mc.training.progress_bar import ProgressBar
from e2mc.training.result import TrainResult
from e2mc.training.sampling import EpochBatchSampler, SeededSamples


class Trainer:
    """Trains ``method`` (+ ``addon``) on ``dataset`` as ``cfg.training`` says, in ``run_dir``,
    resuming from its checkpoint if present.

    ``base_epoch``: epochs the starting weights were trained, added to the epoch and iteration
    numbers the method's hooks receive. ``callbacks`` see the trainer as a
    :class:`~e2mc.training.callbacks.TrainerView`; their state is checkpointed. ``hardware``:
    the values of the ``auto`` keys (chosen here when not given).
    """

    def __init__(self, method: nn.Module, addon: nn.Module, dataset: Dataset, cfg: RunConfig,
                 run_dir: str | Path, runtime: Runtime | None = None, base_epoch: int = 0,
                 prepare_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,
                 callbacks: list[Callback] | None = None,
                 data_identity: dict[str, Any] | None = None,
                 hardware: dict[str, Choice] | None = None) -> None:
        self.cfg = cfg
        self.data_identity = data_identity
        self.training_cfg = cfg.training
        self.run = RunDir(run_dir)
        self.callbacks: list[Callback] = list(callbacks or [])  # their states are checkpointed
        self._hooks: list[Callback] = [
            EpochCopies(), ProgressBar(cfg.monitor.keep_best or "val/knn"), RunEstimate(),
            *self.callbacks]
        self.logger: MetricsLogger | None = None
        #: every key logged in this invocation: the step and the value it was last logged with
        self.last_logged: dict[str, tuple[int, Any]] = {}
        self.runtime = runtime or init_runtime(self.training_cfg.device)
        self.method = method
        self.addon = addon
        self.base_epoch = base_epoch
        self.start_epoch = 0
        self.prepare_optimizer = prepare_optimizer
        self._pending_training_state: dict[str, Any] | None = None
        if hardware is None:
            hardware = hardware_choices(cfg, self.runtime.device)
        self.precision: str = chosen(cfg, hardware, "training.precision")
        self.channels_last: bool = chosen(cfg, hardware, "training.channels_last")
        if self.precision == "fp16" and self.runtime.device.type != "cuda":
            raise ValueError("training.precision=fp16 needs CUDA; use bf16 or fp32 on CPU")
        self.sampler = EpochBatchSampler(len(dataset), self.training_cfg.batch_size,
                                         seed=self.training_cfg.seed, rank=self.runtime.rank,
                                         world_size=self.runtime.world_size)
        #: how an epoch uses the images (saved in every checkpoint; e2mc compare flags drops)
        self.epoch_use = use = self.sampler.use()
        if use["dropped"] and self.runtime.is_main:
            print(f"note: every epoch leaves {use['dropped']} of the {use['images']} images out "
                  f"(batch {use['batch']}: {use['steps']} step(s) per epoch; other images each "
                  "epoch)", file=sys.stderr)
        workers = chosen(cfg, hardware, "data.num_workers")
        # fast / device pipelines: what finishes the views on the training device
        self.device_augment = getattr(dataset, "device_augment", None)
        # on a CPU the fast pipeline normalises into the previous step's views (saves page
        # faults); they are free by then: the backward freed the graph that held them
        self._reused_views: list[torch.Tensor] | None = None
        self._reuse_views = (self.device_augment is not None
                             and not self.device_augment.photometric
                             and self.runtime.device.type == "cpu")
        self.loader = DataLoader(
            SeededSamples(dataset), batch_sampler=self.sampler, num_workers=workers,
            collate_fn=getattr(dataset, "collate_fn", None) or collate_views,
            pin_memory=self.runtime.device.type == "cuda", persistent_workers=workers > 0,
            **loader_options(workers))
        self._setup_model()
        self.guard = NonFiniteGuard(self.method, self.optimizer, self.scaler, self.runtime)

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
        if self.channels_last:
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
                                           enabled=self.precision == "fp16")
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
        if self.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.runtime.device.type, dtype=dtype)

    # ------------------------------------------------------------------ what callbacks use
    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append a record to ``metrics.jsonl`` / TensorBoard (main process; callbacks use it)."""
        self.last_logged.update((k, (step, v)) for k, v in metrics.items())
        if self.logger is not None:
            self.logger.log(step, metrics)

    def save_model(self, path: Path, run_epoch: int, step: int) -> None:
        """Model-only checkpoint of the current weights, written atomically by the main process."""
        self.guard.refuse_bad_weights(step, agree=False)  # may be called on the main process only
        if self.runtime.is_main:
            save_checkpoint(
                path, self.method, epoch=self.base_epoch + run_epoch, run_epoch=run_epoch,
                step=step, base_epoch=self.base_epoch, run_config=self.cfg.to_dict(),
                epoch_use=self.epoch_use)

    def fixed_views(self, n: int) -> list[torch.Tensor]:
        """The views of training images ``0 .. n-1``, image ``i``'s drawn under seed ``i`` (the
        same batch at every call), made as a training batch is."""
        keys = [(i, i) for i in range(min(n, len(self.loader.dataset)))]
        items = self.loader.dataset.__getitems__(keys)
        return self._views_on_device(self.loader.collate_fn(items), reuse=False)

    def _views_on_device(self, batch: Any, reuse: bool = False) -> list[torch.Tensor]:
        """A loader batch on the training device, finished by the pipeline's device part, in the
        step's memory format; ``reuse``: into the previous step's tensors."""
        views = batch[0] if isinstance(batch, tuple) else batch
        views = [v.to(self.runtime.device, non_blocking=True) for v in views]
        if self.device_augment is not None:  # views to normalise, or crops + params
            views = self.device_augment(
                views, batch[1] if self.device_augment.photometric else None,
                out=self._reused_views if reuse else None)
        if self.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    # ------------------------------------------------------------------ checkpoints
    def _save(self, run_epoch: int, step: int, batch_in_epoch: int, skipped: int) -> Path:
        self.guard.refuse_bad_weights(step)
        state = checkpoint_state(  # collective under DDP
            method=self.method, addon=self.addon, optimizer=self.optimizer, scaler=self.scaler,
            cfg=self.cfg, runtime=self.runtime, callbacks=self.callbacks,
            base_epoch=self.base_epoch, run_epoch=run_epoch, step=step,
            batch_in_epoch=batch_in_epoch, skipped=skipped, data=self.data_identity)
        state["epoch_use"] = self.epoch_use
        path = self.run.checkpoint
        if self.runtime.is_main:
            save_checkpoint(path, self.method, **state)
        self.guard.last_good = (path, step)
        return path

    def _resume(self) -> tuple[int, int, int, int]:
        """Returns ``(run_epoch, step, batch_in_epoch, skipped)`` to start from."""
        resumed = resume(self.run, method=self.method, addon=self.addon,
                         optimizer=self.optimizer, scaler=self.scaler, cfg=self.cfg,
                         runtime=self.runtime, callbacks=self.callbacks,
                         base_epoch=self.base_epoch, prepare_optimizer=self.prepare_optimizer)
        if resumed is None:
            return 0, 0, 0, 0
        self.base_epoch, self.start_epoch = resumed.base_epoch, resumed.run_epoch
        self._pending_training_state = resumed.training_state
        self.guard.last_good = (resumed.path, resumed.step)
        return resumed.run_epoch, resumed.step, resumed.batch_in_epoch, resumed.skipped

    def _enter_epoch(self, run_epoch: int, mid_epoch: bool) -> None:
        """``method.set_epoch``, and after a resume the saved training state in the order an
        uninterrupted run had them: a mid-epoch checkpoint was taken after ``set_epoch``."""
        pending, self._pending_training_state = self._pending_training_state, None
        if pending is not None and not mid_epoch:
            self.method.load_training_state(pending)
        self.method.set_epoch(self.base_epoch + run_epoch)
        if pending is not None and mid_epoch:
            self.method.load_training_state(pending)

    # ------------------------------------------------------------------ one step
    def _set_lr(self, step: int) -> float:
        """Set the learning rate (and scheduled weight decay) of ``step``; returns the rate."""
        optim, steps_per_epoch = self.cfg.optim, self.steps_per_epoch
        total = self.training_cfg.epochs * steps_per_epoch
        if optim.weight_decay_end is not None:
            set_scheduled_weight_decay(self.optimizer, step, total, optim.weight_decay_end)
        return set_scheduled_lr(self.optimizer, step, total, optim.schedule,
                                round(optim.warmup_epochs * steps_per_epoch),
                                optim.final_lr_fraction)

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

    def _step(self, views: list[torch.Tensor], iteration: int
              ) -> tuple[dict[str, torch.Tensor], str | None]:
        """Forward, backward, update; returns the terms and what was not finite, if anything.
        With ``skip_nonfinite`` a failed step leaves the state as it was before it."""
        guard = self.guard
        snapshot = guard.snapshot() if self.training_cfg.skip_nonfinite else None
        terms = self._forward(views)
        bad = guard.first_nonfinite(terms)
        self.optimizer.zero_grad(set_to_none=True)
        if bad is not None:
            bad = f"{bad} is not finite"
        else:
            self.scaler.scale(terms["loss"]).backward()
            if self.scaler.is_enabled():
                self.scaler.unscale_(self.optimizer)  # fp16: the scaler skips inf gradients
            self.method.after_backward(iteration)
            if not self.scaler.is_enabled():
                bad = guard.nonfinite_gradient()
            if bad is None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                bad = guard.weights_problem()
                if bad is None:
                    self.method.after_step(iteration)  # e.g. an EMA teacher follows the step
            self.optimizer.zero_grad(set_to_none=True)
        if bad is not None and snapshot is not None:
            guard.restore(snapshot)
        return terms, bad

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        """Train until ``training.epochs`` run epochs are done (or ``training.max_steps``)."""
        training_cfg, runtime, hooks = self.training_cfg, self.runtime, self._hooks
        run_epoch, step, start_batch, skipped = self._resume()
        # the run's global iterations, for schedules over the run (an EMA teacher's momentum)
        self.method.set_run_length(self.base_epoch * self.steps_per_epoch, self.total_steps)
        #: (run_epoch, step, batch_in_epoch, skipped) after the last completed step
        self._position: tuple[int, int, int, int] | None = None
        if runtime.is_main:
            self.run.root.mkdir(parents=True, exist_ok=True)
        steps_per_epoch = self.steps_per_epoch
        if start_batch >= steps_per_epoch:  # fewer images now (an accepted data change):
            run_epoch, start_batch = run_epoch + 1, 0  # the interrupted epoch has no batch left
        logger = self.logger = MetricsLogger(self.run.root, runtime.is_main, config=self.cfg)
        ckpt_path: Path | None = self.run.checkpoint if step else None
        stopped = False
        stop_reason: str | None = None
        for cb in hooks:
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
                for cb in hooks:
                    cb.on_epoch_start(self, run_epoch, start_batch)
                window_images, window_start = 0, time.perf_counter()
                self.model.train()
                batches = enumerate(self.loader, start=start_batch)
                for batch_idx, batch in self._unless_unreadable(batches):
                    iteration = self.base_epoch * steps_per_epoch + step
                    lr = self._set_lr(step)
                    self.method.before_step(iteration)
                    views = self._views_on_device(batch, reuse=self._reuse_views)
                    if self._reuse_views:
                        self._reused_views = views
                    terms, bad = self._step(views, iteration)
                    if bad is not None:
                        where = f"{bad} at step {step + 1} (epoch {run_epoch}, batch {batch_idx})"
                        if not training_cfg.skip_nonfinite:
                            raise NonFiniteLossError(
                                f"{where}; stopping. {self.guard.last_good_text()}; "
                                "--skip-nonfinite skips such steps")
                        skipped += 1
                        if runtime.is_main:
                            print(f"warning: {where}; step skipped ({skipped} so far)",
                                  file=sys.stderr)
                    step += 1
                    window_images += training_cfg.batch_size
                    if step % training_cfg.log_every == 0 or batch_idx == steps_per_epoch - 1:
                        elapsed = max(time.perf_counter() - window_start, 1e-9)
                        last = {k: float(v.item()) for k, v in terms.items()}
                        last.update(lr=lr, images_per_s=window_images / elapsed,
                                    skipped_steps=skipped)
                        self.log(step, {"epoch": run_epoch, "batch": batch_idx, **last})
                        window_images, window_start = 0, time.perf_counter()
                    done_epoch = batch_idx == steps_per_epoch - 1
                    if done_epoch:
                        run_epoch += 1
                    if training_cfg.max_steps is not None and step >= training_cfg.max_steps:
                        stopped, stop_reason = True, f"training.max_steps={training_cfg.max_steps}"
                    for cb in hooks:
                        reason = cb.on_step_end(self, step, run_epoch, terms)
                        if reason and not stopped:
                            stopped, stop_reason = True, reason
                    every = training_cfg.checkpoint_every_steps
                    self._position = (run_epoch, step, 0 if done_epoch else batch_idx + 1,
                                      skipped)
                    if done_epoch or stopped or (every and step % every == 0):
                        ckpt_path = self._save(*self._position)
                        if done_epoch:
                            for cb in hooks:
                                cb.on_epoch_end(self, run_epoch, step)
                    if stopped:
                        break
                start_batch = 0
            result = TrainResult(run_epoch=run_epoch, step=step, skipped_steps=skipped,
                                 completed=run_epoch >= training_cfg.epochs, checkpoint=ckpt_path,
                                 method=self.method, stop_reason=stop_reason)
            for cb in hooks:
                cb.on_fit_end(self, result)
        finally:
            logger.close()
            self.logger = None
            self._stop_workers()
        return result

    def _unless_unreadable(self, batches: Any) -> Any:
        """``batches``; on an unreadable image the checkpoint is first written at the last
        completed step (one process only: under DDP the other ranks could not join)."""
        from e2mc.errors import CorruptImageError, describe

        try:
            yield from batches
        except CorruptImageError as err:
            note = ""
            if self._position is not None and not self.runtime.distributed \
                    and self._position[1] > (self.guard.last_good or (None, -1))[1]:
                path = self._save(*self._position)
                note = f"; checkpoint written at step {self._position[1]} ({path})"
            elif self.guard.last_good is not None:
                note = f"; the checkpoint at step {self.guard.last_good[1]} is kept"
            raise CorruptImageError(
                f"{describe(err)[1]}{note}. Replace or remove the file and resume with "
                "--override-config, or resume with --skip-corrupt to drop unreadable images"
            ) from err

    def _stop_workers(self) -> None:
        """Stop the persistent workers of an unfinished iterator: they ignore the pre-emption
        signals, so the interpreter's exit would wait for them forever."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            self.loader._iterator = None
