"""The warning for a monitor metric whose probes train on fewer than 5 labels per class: with
800 training images, ``val/linear_1%`` trains on one label of each of 10 classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from e2mc.config import MonitorConfig
from e2mc.training.monitor import ValidationData, ValidationMonitor, thin_probes_warning
from helpers import TINY_RUN


def _data(n_val: int, train_size: int, classes: int = 10) -> ValidationData:
    return ValidationData.from_dataset(None, np.arange(n_val) % classes, train_size=train_size)


def test_one_label_per_class_names_the_metrics_that_serve():
    """200 held out of 1000: the probe-train half has 10 images of each class; 1% of 800 is
    one label of each class (at least one per class), 10% of 800 is 8 of each (80)."""
    data = _data(200, 800)
    warning = thin_probes_warning(data, MonitorConfig(keep_best="val/linear_1%"))
    assert warning == (
        "warning: the monitor's val/linear_1% (10 labels) trains on fewer than 5 labels per "
        "class (10 classes) (keep-best selects on it), so its values are mostly the draw of "
        "those labels; val/linear_100% or val/knn would serve (--keep-best / search --metric); "
        "--set monitor.fractions=[0.01,0.1,1] adds val/linear_10% (80 labels)")


def test_a_small_split_asks_for_a_larger_one():
    """60 held out: 30 probe-train images (3 per class), too few for every metric."""
    warning = thin_probes_warning(_data(60, 800), MonitorConfig())
    assert warning is not None
    assert ("val/linear_1% (10 labels), val/linear_100% (30 labels), val/knn (30 labels) train "
            "on fewer than 5") in warning
    assert "would serve" not in warning and "keep-best" not in warning
    assert warning.endswith("hold out at least 100 images (--val-split 100): the probes train "
                            "on half of the 60 held out")


def test_a_knn_bank_too_small_for_keep_best_is_said():
    """keep-best on val/knn with 40 held out: a bank of 20 images, 2 per class."""
    warning = thin_probes_warning(_data(40, 800, classes=10),
                                  MonitorConfig(keep_best="val/knn", fractions=(1.0,)))
    assert warning is not None and warning.startswith(
        "warning: the monitor's val/linear_100% (20 labels), val/knn (20 labels) train on fewer "
        "than 5 labels per class (10 classes) (keep-best selects on it)")


@pytest.mark.parametrize("n_val,train_size", [(2000, 60000), (100, 5000)])
def test_enough_labels_no_warning(n_val, train_size, capsys):
    """1% of 60000 is 60 per class; 1% of 5000 is 5 per class (50 of the half's 50), exactly
    enough."""
    data = _data(n_val, train_size)
    assert thin_probes_warning(data, MonitorConfig(keep_best="val/linear_1%")) is None
    ValidationMonitor(data, MonitorConfig())
    assert "labels per class" not in capsys.readouterr().err


def test_every_command_with_a_monitor_prints_it_once(tmp_path: Path, capsys):
    """The monitor callback (continue, pretrain, keep-best and search runs build it) prints
    the warning on stderr, one line."""
    from e2mc.cli import main

    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, x_train=rng.integers(0, 256, (40, 16, 16), dtype=np.uint8),
             y_train=np.arange(40) % 4)
    sets = [*TINY_RUN, "training.max_steps=1", "monitor.probe_epochs=1", "monitor.knn_k=3"]
    assert main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
                 "--out", str(tmp_path / "run"), "--val-split", "0.2",
                 *[a for s in sets for a in ("--set", s)]]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "labels per class" in x]
    # 8 held out of 40: a probe-train half of 4 images, one per class
    assert lines == ["warning: the monitor's val/linear_1% (4 labels), val/linear_100% (4 "
                     "labels), val/knn (4 labels) train on fewer than 5 labels per class (4 "
                     "classes), so their "
                     "values are mostly the draw of those labels; hold out at least 40 images "
                     "(--val-split 40): the probes train on half of the 8 held out"]
