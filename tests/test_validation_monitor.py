"""The validation split, the monitor and keep-best (``--val-split``, ``--monitor-every``,
``--keep-best``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from e2mc.artifacts import RunDir
from e2mc.config import load_config, metric_names, resolve_metric
from e2mc.data.holdout import holdout_size, holdout_split
from e2mc.training.keep_best import KeepBest
from helpers import TINY_RUN, free_port

TINY = [*TINY_RUN, "data.val_split=0.2", "monitor.every=1", "monitor.probe_epochs=2",
        "monitor.knn_k=3"]


def _tiny_data(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (n, 16, 16), dtype=np.uint8),
             y_train=np.arange(n) % 4)
    return path


# --------------------------------------------------------------------------- the split
def test_holdout_split_is_disjoint_deterministic_and_stratified() -> None:
    labels = np.repeat(np.arange(10), 100)[np.random.default_rng(1).permutation(1000)]
    train, val, stratified = holdout_split(1000, 0.2, seed=3, labels=labels)
    assert stratified and len(val) == 200 and len(train) == 800
    assert np.intersect1d(train, val).size == 0
    assert np.array_equal(np.union1d(train, val), np.arange(1000))
    assert np.bincount(labels[val], minlength=10).tolist() == [20] * 10  # each class its share
    again = holdout_split(1000, 0.2, seed=3, labels=labels)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], val)
    other = holdout_split(1000, 0.2, seed=4, labels=labels)[1]
    assert not np.array_equal(other, val)
    count = holdout_split(1000, 150, seed=3)[1]  # a count, no labels: a plain random draw
    assert len(count) == 150 and np.all(np.diff(count) > 0)


@pytest.mark.parametrize("size", [0, -0.1, 1.5, 1000, 2000])
def test_holdout_size_rejects_what_leaves_a_side_empty(size: float) -> None:
    with pytest.raises(ValueError, match="validation split"):
        holdout_size(1000, size)


def test_a_split_that_leaves_less_than_one_batch_is_an_error(tmp_path: Path) -> None:
    from e2mc.training.build import holdout, training_images

    data = _tiny_data(tmp_path / "d.npz")
    cfg = load_config("fmnist-vicreg-continued", [*TINY, f"data.dataset={data}",
                                                 "data.val_split=0.9"])
    with pytest.raises(ValueError, match="less than one batch of 8"):
        holdout(cfg, training_images(cfg)[0])


def _split_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE="2")
    import torch.distributed as dist

    from e2mc.training.run import run_training

    cfg = load_config("fmnist-vicreg-pretrain", [*TINY, f"data.dataset={data}",
                                                 "monitor.keep_best=val/knn"])
    result = run_training(cfg, Path(out) / "run")
    from e2mc.training.build import holdout, training_images

    mine = holdout(cfg, training_images(cfg)[0])
    gathered: list = [None, None]
    dist.all_gather_object(gathered, (mine["train"], mine["val"]))
    torch.save({"split_ok": gathered[0] == gathered[1],
                "params": {k: v.detach().clone() for k, v in result.method.named_parameters()}},
               Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_two_gloo_ranks_agree_on_the_split_and_the_monitor(tmp_path: Path) -> None:
    data = _tiny_data(tmp_path / "d.npz")
    mp.spawn(_split_worker, args=(free_port(), str(data), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["split_ok"] and r1["split_ok"]
    for key, value in r0["params"].items():
        assert torch.equal(value, r1["params"][key]), key
    run = RunDir(tmp_path / "run")
    saved = run.read_val_split()
    assert saved is not None and len(saved["val"]) == 8 and len(saved["train"]) == 32
    steps = [r["step"] for r in run.read_metrics() if "val/knn" in r]
    assert steps == [0, 1, 2, 3, 4]  # once per step, by rank 0 only
    assert run.best.is_file()


# --------------------------------------------------------------------------- metrics and config
def test_metric_names_and_unknown_metric() -> None:
    assert metric_names([0.01, 1.0]) == ["val/knn", "val/linear_1%", "val/linear_100%",
                                      "val/rankme", "val/entropy"]
    assert resolve_metric("knn", [0.01, 1.0]) == "val/knn"
    with pytest.raises(ValueError, match="did you mean val/linear_1%"):
        resolve_metric("val/linear_1", [0.01, 1.0])
    with pytest.raises(ValueError, match="unknown monitor metric 'accuracy'"):
        load_config("fmnist-vicreg-continued", ["data.val_split=0.1",
                                               "monitor.keep_best=accuracy"])


def test_keep_best_and_monitor_need_a_validation_split() -> None:
    with pytest.raises(ValueError, match="--val-split"):
        load_config("fmnist-vicreg-continued", ["monitor.keep_best=val/knn"])
    with pytest.raises(ValueError, match="data.val_split"):
        load_config("fmnist-vicreg-continued", ["data.val_split=1.5"])


# --------------------------------------------------------------------------- keep-best
def test_keep_best_picks_the_best_step_and_stops_on_patience() -> None:
    tracker = KeepBest("val/knn", patience=2)
    trajectory = [(0, 50.0), (10, 52.0), (20, 51.0), (30, 55.0), (40, 54.0), (50, 54.5)]
    stops = [tracker.update(step, value)[1] for step, value in trajectory]
    assert (tracker.best_step, tracker.best_value) == (30, 55.0)
    assert stops == [False, False, False, False, False, True]
    base_wins = KeepBest("val/knn")
    for step, value in [(0, 60.0), (10, 59.0), (20, float("nan")), (30, 60.0)]:
        base_wins.update(step, value)
    assert base_wins.best_step == 0  # equal is not better; NaN never is
    delta = KeepBest("val/knn", min_delta=1.0)
    for step, value in [(0, 50.0), (10, 50.5), (20, 52.0)]:
        delta.update(step, value)
    assert delta.best_step == 20


_SCRIPTED = """
import sys, torch
from pathlib import Path
import e2mc.training.monitor as monitor
values = [float(v) for v in sys.argv[3].split(",")]
seen = []
def scripted(method, data, cfg, device="cpu"):
    step = len(seen)
    seen.append(step)
    torch.save({k: v.detach().clone() for k, v in method.state_dict().items()},
               Path(sys.argv[2]) / f"weights_{step}.pt")
    return {"val/knn": values[step], "val/linear_1%": 0.0, "val/linear_100%": 0.0,
            "val/rankme": 0.0, "val/entropy": 0.0, "val/seconds": 0.0}
monitor.validation_metrics = scripted
kill_at = int(sys.argv[4])
if kill_at:
    import os, signal
    import e2mc.checkpoints.io as io
    real_replace, count = io.os.replace, [0]
    def replace(src, dst):
        if Path(dst).name == "best.pt":
            count[0] += 1
            if count[0] == kill_at:  # the new best.pt is written but not yet in place
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)
    io.os.replace = replace
from e2mc.config import load_config
from e2mc.training.run import run_training
cfg = load_config("fmnist-vicreg-continued", sys.argv[5:])
run_training(cfg, sys.argv[1])
"""


def _scripted_run(tmp_path: Path, run: Path, values: str, kill_at: int = 0
                  ) -> subprocess.CompletedProcess:
    from e2mc.checkpoints import save_checkpoint
    from e2mc.methods import build_method

    start = tmp_path / "start.pt"
    if not start.exists():
        torch.manual_seed(0)
        save_checkpoint(start, build_method("vicreg", backbone="cnn5_small",
                                            in_channels=1, projector="32-32"))
    weights = tmp_path / f"weights-{run.name}"
    weights.mkdir(exist_ok=True)
    args = [*TINY, f"data.dataset={_tiny_data(tmp_path / 'd.npz')}",
            f"init.checkpoint={start}", "monitor.keep_best=val/knn"]
    return subprocess.run([sys.executable, "-c", _SCRIPTED, str(run), str(weights), values,
                           str(kill_at), *args], capture_output=True, text=True)


def _model(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_keep_best_writes_the_step_of_the_best_value(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _scripted_run(tmp_path, run, "50,52,57,51,55")  # steps 0..4: best at step 2
    assert proc.returncode == 0, proc.stderr[-2000:]
    best = _model(RunDir(run).best)
    expected = torch.load(tmp_path / "weights-run" / "weights_2.pt", weights_only=True)
    assert best.keys() == expected.keys()
    differ = [k for k in best if not torch.equal(best[k], expected[k])]
    assert not differ, f"best.pt is not step 2's model in {differ}; {proc.stderr[-2000:]}"
    assert "keep-best: step 2" in proc.stderr, proc.stderr[-2000:]
    assert "val/knn by step: 0: 50.00" in proc.stderr, proc.stderr[-2000:]
    assert RunDir(run).monitor_plot.is_file(), proc.stderr[-2000:]


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_keep_best_says_when_no_step_beats_the_start(tmp_path: Path) -> None:
    run = tmp_path / "base-wins"
    proc = _scripted_run(tmp_path, run, "60,59,58,57,56")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no step beat the starting model on val/knn" in proc.stderr
    start = _model(tmp_path / "start.pt")
    best = _model(RunDir(run).best)
    assert all(torch.equal(best[k], start[k]) for k in best)


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_a_kill_while_best_pt_is_replaced_leaves_the_previous_best(tmp_path: Path) -> None:
    run = tmp_path / "killed"
    proc = _scripted_run(tmp_path, run, "50,52,57,51,55", kill_at=2)  # the 2nd write: step 1
    assert proc.returncode == -signal.SIGKILL
    best = _model(RunDir(run).best)  # still the first best (step 0), complete and loadable
    step0 = torch.load(tmp_path / "weights-killed" / "weights_0.pt", weights_only=True)
    assert all(torch.equal(best[k], step0[k]) for k in best)
    proc = _scripted_run(tmp_path, run, "50,52,57,51,55")  # resume: same best as uninterrupted
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [r for r in RunDir(run).read_metrics() if "val/knn" in r]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert json.loads(json.dumps(records[2]))["val/knn"] == 57.0
    assert not RunDir(run).stale_temp_files()


def test_cli_bad_split_and_metric_exit_2_and_write_nothing(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    from e2mc.cli import main

    data = _tiny_data(tmp_path / "d.npz")
    run = tmp_path / "run"
    sets = [a for item in TINY if not item.startswith("data.val_split")
            for a in ("--set", item)]
    common = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
              "--out", str(run), *sets]
    assert main([*common, "--val-split", "0.9"]) == 2
    assert "less than one batch" in capsys.readouterr().err
    assert main([*common, "--val-split", "0.2", "--keep-best", "val/top1"]) == 2
    assert "unknown monitor metric 'val/top1'" in capsys.readouterr().err
    assert not run.exists()


def test_the_monitor_plot_draws_each_validation_metric_once(tmp_path: Path) -> None:
    """MonitorPlot's drawing: one panel per monitor metric the history has, the kept step
    marked; ``val/seconds`` is not drawn."""
    import matplotlib.image

    from e2mc.config import metric_names
    from e2mc.diagnostics.figures import plot_loss_terms

    history = [{"step": s, "val/knn": 50.0 + s, "val/linear_1%": 40.0 - s, "val/rankme": 9.0,
                "val/seconds": 1.0} for s in (0, 5, 10)]  # no val/linear_100%, no val/entropy
    path = tmp_path / "monitor.png"
    plot_loss_terms(history, path, keys=metric_names([0.01, 1.0]), kept_step=5, kept_by="val/knn")
    height, width, _ = matplotlib.image.imread(path).shape
    assert (height, width) == (260, 1080)  # three 3.6 x 2.6-inch panels at 100 dpi
    assert [p.name for p in tmp_path.iterdir()] == ["monitor.png"]  # no temporary file left
