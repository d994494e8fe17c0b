"""The validation monitor: how good the embeddings are *now* on the held-out validation split,
at step 0 (the starting model), every ``monitor.every`` steps and at the last step; the protocol
is docs/validation.md's. ``val/knn`` and ``val/linear_<f>`` score the backbone features of a
probe-test half against a probe-train half, ``val/rankme`` and ``val/entropy`` describe the
projector embeddings, ``val/seconds`` times it. It runs in eval mode under ``no_grad`` with the
generators forked, so monitoring does not change training."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from e2mc.config import metric_names
from e2mc.training.callbacks import Callback
from e2mc.training.preemption import is_preemption

if TYPE_CHECKING:  # pragma: no cover
    from torch.utils.data import Dataset

    from e2mc.config import MonitorConfig
    from e2mc.distributed import Runtime
    from e2mc.training.callbacks import FitResult, TrainerView
    from e2mc.training.keep_best import KeepBest


@dataclass
class ValidationData:
    """The validation images (eval transform) and their probe-train / probe-test halves."""

    dataset: Dataset
    labels: np.ndarray
    probe_train: np.ndarray
    probe_test: np.ndarray
    train_size: int  # images of the training set: the probes' label budgets refer to it

    @classmethod
    def from_dataset(cls, dataset: Dataset, labels: np.ndarray, train_size: int,
                     seed: int = 0) -> ValidationData:
        from e2mc.data.holdout import holdout_split

        labels = np.asarray(labels)
        classes, counts = np.unique(labels, return_counts=True)
        if len(labels) < 4 or counts.min() < 2:
            raise ValueError(f"the validation split has {len(labels)} images, "
                             f"{counts.min() if len(counts) else 0} of class "
                             f"{classes[counts.argmin()] if len(counts) else '-'}; the monitor "
                             "trains its probes on one half and scores them on the other, so it "
                             "needs two images of every class: hold out more (--val-split)")
        train, test, _ = holdout_split(len(labels), 0.5, seed, labels)
        if len(test) < 100:
            print(f"warning: the monitor scores on {len(test)} validation images: one image is "
                  f"{100 / len(test):.2g} points of accuracy, so its values move in steps that "
                  "large; hold out more images (--val-split) for finer ones", file=sys.stderr)
        return cls(dataset, labels, train, test, train_size)


#: Fewer probe labels per class than this, and a probe's accuracy is mostly the draw of its labels.
MIN_LABELS_PER_CLASS = 5
#: Label fractions suggested in place of one that trains on too few labels.
_NICE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def probe_labels(data: ValidationData, fraction: float) -> int:
    """How many probe-train labels the probe of ``fraction`` (of the training set) trains on."""
    from e2mc.data.subsets import label_fraction_indices

    y = data.labels[data.probe_train]
    return len(label_fraction_indices(y, min(1.0, fraction * data.train_size / len(y)), 0))


def thin_probes_warning(data: ValidationData, cfg: MonitorConfig) -> str | None:
    """The warning for monitor metrics that train on fewer than :data:`MIN_LABELS_PER_CLASS`
    labels per class, naming what would serve; None when every metric has enough."""
    from e2mc.data.subsets import fraction_label

    classes = len(np.unique(data.labels))
    need = MIN_LABELS_PER_CLASS * classes
    half = len(data.probe_train)
    counts = {f"val/linear_{fraction_label(f)}": probe_labels(data, f) for f in cfg.fractions}
    counts["val/knn"] = half  # its bank: the probe-train half
    thin = {name: n for name, n in counts.items() if n < need}
    if not thin:
        return None
    serve = [name for name, n in counts.items() if n >= need]
    added = next((f for f in _NICE_FRACTIONS if f"val/linear_{fraction_label(f)}" not in counts
                  and probe_labels(data, f) >= need), None)
    options = []
    if serve:
        options.append(f"{' or '.join(serve)} would serve (--keep-best / search --metric)")
    if added is not None:
        fractions = sorted({*cfg.fractions, added})
        options.append(f"--set monitor.fractions=[{','.join(f'{f:g}' for f in fractions)}] "
                       f"adds val/linear_{fraction_label(added)} "
                       f"({probe_labels(data, added)} labels)")
    if half < need:
        options.append(f"hold out at least {2 * need} images (--val-split {2 * need}): the "
                       f"probes train on half of the {len(data.labels)} held out")
    selected = " (keep-best selects on it)" if cfg.keep_best in thin else ""
    return (f"warning: the monitor's {', '.join(f'{k} ({n} labels)' for k, n in thin.items())} "
            f"train{'s' if len(thin) == 1 else ''} on fewer than {MIN_LABELS_PER_CLASS} labels "
            f"per class ({classes} classes){selected}, so {'its' if len(thin) == 1 else 'their'} "
            f"values are mostly the draw of those labels; {'; '.join(options)}")


@torch.no_grad()
def validation_vectors(method: torch.nn.Module, data: ValidationData, cfg: MonitorConfig,
                       device: torch.device | str = "cpu"
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Backbone features and projector embeddings of the validation images (eval mode, the
    generators forked: monitoring does not change training)."""
    from e2mc.evaluation.features import features_and_embeddings

    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        numpy_state = np.random.get_state()
        try:
            return features_and_embeddings(method.backbone, method, data.dataset,
                                           cfg.batch_size, device, progress=False,
                                           desc="monitor")
        finally:
            np.random.set_state(numpy_state)


def vector_metrics(feats: torch.Tensor, embs: torch.Tensor | None, data: ValidationData,
                   cfg: MonitorConfig, space: str, device: torch.device | str = "cpu"
                   ) -> dict[str, float]:
    """The monitor's metrics (see the module docstring) from :func:`validation_vectors`:
    ``val/knn``, ``val/linear_<f>`` (mean over the seeds), and ``val/rankme`` and
    ``val/entropy`` of the projector embeddings (none without them)."""
    from e2mc.criterion import m_spacings_entropy
    from e2mc.data.subsets import fraction_label
    from e2mc.diagnostics.embedding_stats import effective_rank, marginal_values
    from e2mc.evaluation.knn import knn_classify
    from e2mc.evaluation.probe_settings import linear_settings
    from e2mc.evaluation.sweep import linear_protocol

    x, y, tr, te = feats.numpy(), data.labels, data.probe_train, data.probe_test
    knn = knn_classify(x[tr], y[tr], x[te], y[te], ks=(min(cfg.knn_k, len(tr)),),
                       num_classes=int(y.max()) + 1, weightings=("weighted",))
    out = {"val/knn": float(knn[0].top1)}
    effective = {f: min(1.0, f * data.train_size / len(tr)) for f in cfg.fractions}
    entries = linear_protocol(
        x[tr], y[tr], x[te], y[te], sorted(set(effective.values())), cfg.label_seeds,
        config_for=lambda f: linear_settings("generic", f, epochs=cfg.probe_epochs),
        device=device)
    for f in cfg.fractions:
        values = [e.result.top1_last for e in entries if e.fraction == effective[f]]
        out[f"val/linear_{fraction_label(f)}"] = float(np.mean(values))
    if embs is not None:
        out["val/rankme"] = float(effective_rank(embs))
        out["val/entropy"] = float(m_spacings_entropy(marginal_values(embs, space)
                                                      .double()).mean())
    return out


def validation_metrics(method: torch.nn.Module, data: ValidationData, cfg: MonitorConfig,
                       runtime: Runtime) -> dict[str, float]:
    """One evaluation of the monitor (see the module docstring). Under DDP every rank extracts
    the vectors (a method's forward may hold collectives), rank 0 scores them and broadcasts
    the values."""
    import torch.distributed as dist

    start = time.perf_counter()
    feats, embs = validation_vectors(method, data, cfg, runtime.device)
    box: list[Any] = [None]
    if runtime.is_main:
        space = getattr(method, "compact_space", "standardized")
        box[0] = {**vector_metrics(feats, embs, data, cfg, space, runtime.device),
                  "val/seconds": time.perf_counter() - start}
    if runtime.distributed:
        dist.broadcast_object_list(box, src=0)
    return box[0]


class ValidationMonitor(Callback):
    """Evaluates :func:`validation_metrics` at step 0, every ``cfg.every`` steps (None: every
    epoch) and at the last step, and logs the values as one record."""

    name = "monitor"

    def __init__(self, data: ValidationData, cfg: MonitorConfig) -> None:
        self.data, self.cfg = data, cfg
        self.history: list[dict[str, float]] = []
        warning = thin_probes_warning(data, cfg)
        if warning is not None:
            print(warning, file=sys.stderr)

    def _evaluate(self, trainer: TrainerView, step: int, run_epoch: int) -> None:
        values = validation_metrics(trainer.method, self.data, self.cfg, trainer.runtime)
        self.history.append({"step": step, **values})
        trainer.log(step, {"epoch": run_epoch, **values})

    def on_fit_start(self, trainer: TrainerView, step: int) -> None:
        if step == 0:
            self._evaluate(trainer, 0, 0)

    def on_step_end(self, trainer: TrainerView, step: int, run_epoch: int,
                    terms: dict[str, torch.Tensor]) -> str | None:
        every = self.cfg.every or trainer.steps_per_epoch
        if step % every == 0 or step == trainer.total_steps:
            self._evaluate(trainer, step, run_epoch)
        return None

    def on_fit_end(self, trainer: TrainerView, result: FitResult) -> None:
        last = self.history[-1]["step"] if self.history else None
        # stopped early by max_steps or patience: the last step is scored; a pre-empted run
        # is not (its grace time is for the checkpoint, and it will be resumed)
        if last != result.step and result.step > 0 and not is_preemption(result.stop_reason):
            self._evaluate(trainer, result.step, result.run_epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state.get("history", []))


class MonitorPlot(Callback):
    """At the end, draws the monitor's history (keep-best's step marked); runs after both."""

    name = "monitor_plot"

    def __init__(self, monitor: ValidationMonitor, keep_best: KeepBest | None = None) -> None:
        self.monitor, self.keep_best = monitor, keep_best

    def on_fit_end(self, trainer: TrainerView, result: FitResult) -> None:
        history, keep = self.monitor.history, self.keep_best
        if trainer.runtime.is_main and history:
            from e2mc.diagnostics.figures import plot_loss_terms

            plot_loss_terms(history, trainer.run.monitor_plot,
                            keys=metric_names(self.monitor.cfg.fractions),
                            kept_step=keep.best_step if keep is not None else None,
                            kept_by=keep.metric if keep is not None else None)
