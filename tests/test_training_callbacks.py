"""The trainer's parts behind their narrow interfaces (issue 23): the learning-rate schedule applied
to an optimizer, keep-best reading the logged values (not the monitor), the progress bar as a
callback, one extraction of the validation images per evaluation, and a checkpoint written when
keep-best's state lived inside the monitor's still resuming to the same answer."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from e2mc.artifacts import RunDir
from e2mc.config import RunConfig, load_config
from e2mc.distributed import Runtime, init_runtime
from e2mc.optim import lr_factor, set_scheduled_lr
from e2mc.training.checkpointing import callback_states
from e2mc.training.keep_best import KeepBest
from helpers import TINY_RUN


class View:
    """A stand-in for the trainer as callbacks see it (:class:`TrainerView`)."""

    def __init__(self, root: Path) -> None:
        self.runtime = Runtime(torch.device("cpu"))
        self.cfg = RunConfig()
        self.method = torch.nn.Linear(2, 2)  # built by name (no user module in its hparams)
        self.run = RunDir(root)
        self.start_epoch = 0
        self.steps_per_epoch, self.total_steps = 10, 100
        self.last_logged: dict[str, tuple[int, Any]] = {}
        self.saved: list[tuple[Path, int, int]] = []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.last_logged.update((k, (step, v)) for k, v in metrics.items())

    def save_model(self, path: Path, run_epoch: int, step: int) -> None:
        self.saved.append((path, run_epoch, step))


def test_set_scheduled_lr_scales_every_group_but_the_fixed_ones() -> None:
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 0.4}, {"params": [q], "lr": 0.1, "fix_lr": True}])
    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
    lr = set_scheduled_lr(opt, 5, 20, "cosine", warmup_steps=4, final_fraction=0.0)
    assert lr == pytest.approx(0.4 * lr_factor(5, 20, "cosine", 4)) and lr < 0.4
    assert opt.param_groups[1]["lr"] == 0.1
    assert set_scheduled_lr(opt, 1, 20, "cosine", warmup_steps=4) == pytest.approx(0.4 * 2 / 4)


def test_init_runtime_outside_torchrun_is_one_main_process(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runtime = init_runtime("cpu")
    assert (runtime.rank, runtime.world_size, runtime.is_main, runtime.distributed) == \
        (0, 1, True, False)


def test_keep_best_reads_what_was_logged_at_the_step(tmp_path: Path) -> None:
    view = View(tmp_path)
    keep = KeepBest("val/knn", patience=2)
    view.log(0, {"epoch": 0, "val/knn": 50.0, "val/rankme": 3.0})
    keep.on_fit_start(view, 0)
    view.log(1, {"loss": 1.0})  # a training record: not an evaluation
    assert keep.on_step_end(view, 1, 0, {}) is None and keep.trajectory == [(0, 50.0)]
    view.log(2, {"epoch": 0, "val/knn": 55.0})
    assert keep.on_step_end(view, 2, 0, {}) is None
    view.log(4, {"epoch": 0, "val/knn": 54.0})
    assert keep.on_step_end(view, 4, 0, {}) is None
    view.log(6, {"epoch": 0, "val/knn": 55.0})  # equal is not better: the second stale one
    reason = keep.on_step_end(view, 6, 0, {})
    assert reason == ("early stop: val/knn has not improved for 2 evaluation(s) (best 55.00 "
                      "at step 2)")
    assert [(step, epoch) for _, epoch, step in view.saved] == [(0, 0), (2, 0)]
    assert all(path == view.run.best for path, _, _ in view.saved)
    keep.on_step_end(view, 6, 0, {})  # the same step again: not a second evaluation
    assert len(keep.trajectory) == 4
    out = io.StringIO()
    keep.report(view, file=out)
    assert out.getvalue().startswith("val/knn by step: 0: 50.00, 2: 55.00, 4: 54.00, 6: 55.00\n"
                                     "keep-best: step 2 (epoch 0) has the best val/knn, 55.00")
    view.log(8, {"epoch": 0, "val/linear_1%": 40.0})
    with pytest.raises(ValueError, match=r"val/knn is not among the validation values "
                                         r"\(val/linear_1%\)"):
        keep.on_step_end(view, 8, 0, {})


def test_an_old_checkpoint_hands_keep_best_its_state_from_the_monitor() -> None:
    history = [{"step": 0, "val/knn": 50.0, "val/seconds": 1.0},
               {"step": 2, "val/knn": 57.0, "val/seconds": 1.0}]
    tracker = {"best_value": 57.0, "best_step": 2, "best_epoch": 0, "stale": 0}
    old = {"preemption": {}, "monitor": {"history": history, "keep_best": tracker},
           "collapse": {"warned": []}}
    states = callback_states(old)
    assert states["monitor"] == old["monitor"] and states["collapse"] == {"warned": []}
    keep = KeepBest("val/knn")
    keep.load_state_dict(states["keep_best"])
    assert keep.state_dict() == {**tracker, "trajectory": [[0, 50.0], [2, 57.0]]}
    fresh = KeepBest("val/knn")
    fresh.load_state_dict(keep.state_dict())  # the new layout round-trips
    assert fresh.state_dict() == keep.state_dict()
    no_keep = callback_states({"monitor": {"history": history, "keep_best": None}})
    assert "keep_best" not in no_keep  # a run without keep-best
    new = {"monitor": {"history": history}, "keep_best": keep.state_dict()}
    assert callback_states(new) == new


def test_the_bar_shows_the_training_record_and_the_latest_validation_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import e2mc.training.progress_bar as progress

    class Bar:
        def __init__(self, total: int, initial: int, desc: str, **options: Any) -> None:
            self.args, self.updates, self.fields, self.closed = (total, initial, desc), 0, [], 0
            self.events: list[str] = []

        def update(self, n: int) -> None:  # tqdm draws the line here
            self.updates += n
            self.events.append("draw")

        def set_postfix(self, fields: dict[str, str], refresh: bool) -> None:
            self.fields.append(dict(fields))
            self.events.append("fields")

        def close(self) -> None:
            self.closed += 1

    monkeypatch.setattr(progress, "progress_bar", Bar)
    view = View(tmp_path)
    view.cfg.training.epochs = 3
    cb = progress.ProgressBar("val/knn")
    view.log(0, {"val/knn": 41.0})
    cb.on_epoch_start(view, 1, 4)
    bar = cb.bar
    assert bar.args == (10, 4, "epoch 2/3")
    record = {"loss": 1.5, "base/loss": 1.0, "addon/loss": 0.5, "images_per_s": 120.4}
    view.log(5, record)
    cb.on_step_end(view, 5, 1, {})
    cb.on_step_end(view, 6, 1, {})  # not logged: the bar only advances
    assert bar.updates == 2
    assert bar.fields == [{"img/s": "120", "loss": "1.5", "base": "1", "addon": "0.5",
                           "val": "41.00"}]
    # the fields of step 5 are set before the update that draws step 5's line
    assert bar.events == ["fields", "draw", "draw"]
    cb.on_epoch_end(view, 2, 10)
    cb.on_fit_end(view, None)  # type: ignore[arg-type]
    assert bar.closed == 1 and cb.bar is None
    view.cfg.training.progress = False
    cb.on_epoch_start(view, 2, 0)
    assert cb.bar is None


def test_the_bar_draws_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar is tqdm's (it was a TypeError there: an option passed twice)."""
    import sys

    from e2mc.training.progress_bar import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    view, cb = View(tmp_path), ProgressBar()
    cb.on_epoch_start(view, 0, 0)
    view.log(1, {"loss": 1.5, "base/loss": 1.0, "addon/loss": 0.5, "images_per_s": 120.4})
    cb.on_step_end(view, 1, 0, {})
    cb.on_epoch_end(view, 1, 1)
    drawn = sys.stderr.getvalue()
    assert "epoch 1/" in drawn and "1/10" in drawn and "loss=1.5" in drawn, drawn


def _tiny_data(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (n, 16, 16), dtype=np.uint8),
             y_train=np.arange(n) % 4)
    return path


def _run(tmp_path: Path, name: str, *sets: str) -> tuple[Any, RunDir]:
    from e2mc.training.run import run_training

    cfg = load_config("fmnist-vicreg-pretrain", [
        *TINY_RUN, f"data.dataset={_tiny_data(tmp_path / 'd.npz')}", "data.val_split=0.2",
        "monitor.every=1", "monitor.probe_epochs=2", "monitor.knn_k=3",
        "monitor.keep_best=val/knn", *sets])
    return run_training(cfg, tmp_path / name), RunDir(tmp_path / name)


@pytest.mark.slow  # integration: three tiny runs
def test_one_extraction_per_evaluation_and_an_old_checkpoint_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    import e2mc.evaluation.features as features

    real, calls = features.features_and_embeddings, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("desc"))
        return real(*args, **kwargs)

    monkeypatch.setattr(features, "features_and_embeddings", counted)
    _, whole = _run(tmp_path, "whole")
    evaluations = [r["step"] for r in whole.read_metrics() if "val/knn" in r]
    assert evaluations == [0, 1, 2, 3, 4] and calls == ["monitor"] * 5
    told = capsys.readouterr().err
    # the same run stopped at step 2, its checkpoint rewritten as before keep-best was a
    # callback of its own, then resumed: the same kept model and the same words
    _run(tmp_path, "old", "training.max_steps=2")
    capsys.readouterr()
    ckpt = torch.load(RunDir(tmp_path / "old").checkpoint, weights_only=True)
    keep = ckpt["callbacks"].pop("keep_best")
    ckpt["callbacks"].pop("monitor_plot")
    keep.pop("trajectory")
    ckpt["callbacks"]["monitor"]["keep_best"] = keep
    torch.save(ckpt, RunDir(tmp_path / "old").checkpoint)
    _, old = _run(tmp_path, "old")  # training.max_steps may change on a resume
    resumed = capsys.readouterr().err
    assert torch.load(old.best, weights_only=True)["step"] == \
        torch.load(whole.best, weights_only=True)["step"]
    best_old = torch.load(old.best, weights_only=True)["model"]
    best_whole = torch.load(whole.best, weights_only=True)["model"]
    assert all(torch.equal(best_old[k], best_whole[k]) for k in best_whole)

    def trajectory(text: str) -> str:
        return next(line for line in text.splitlines() if line.startswith("val/knn by step"))

    assert trajectory(resumed) == trajectory(told)
