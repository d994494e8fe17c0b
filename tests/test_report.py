"""The reports a person reads: analyze's HTML page (tables, inline figures, the configuration's
differences from its base, a run stopped before its first logged step), compare's accuracy
chart, and the reproduction table's transfer column named after its data."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import RunDir
from e2mc.checkpoints import save_checkpoint
from e2mc.config import config_differences, load_config
from e2mc.methods import VICReg


def _npz(path: Path) -> str:
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 255, (40, 28, 28), dtype=np.uint8),
             y_train=np.arange(40) % 4, x_test=rng.integers(0, 255, (48, 28, 28), dtype=np.uint8),
             y_test=np.arange(48) % 4)
    return str(path)


def test_config_differences_against_the_named_preset():
    cfg = load_config("fmnist-vicreg-continued", ["addon.name=e2mc", "training.batch_size=32",
                                                 "addon.params.beta=2.5"])
    base, changed = config_differences(cfg.to_dict())
    assert base == "preset fmnist-vicreg-continued"
    assert changed == [("addon.name", "none", "e2mc"), ("training.batch_size", 256, 32),
                       ("addon.params.beta", None, 2.5)]
    assert config_differences(load_config("fmnist-vicreg-continued").to_dict())[1] == []
    own = load_config(None, ["name=mine", "training.epochs=3"]).to_dict()
    assert config_differences(own) == ("the defaults", [("name", "run", "mine"),
                                                        ("training.epochs", 10, 3)])


def test_analyze_page_tables_config_and_an_empty_metrics_file(tmp_path, capsys):
    """A run stopped before its first logged step (empty metrics.jsonl) is analysed; the page
    shows every run's details and configuration differences as tables, no JSON dumps."""
    from e2mc.cli import main

    cfg = load_config("fmnist-vicreg-continued", ["addon.name=e2mc", "training.batch_size=32"])
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    torch.manual_seed(0)
    save_checkpoint(run.checkpoint, VICReg("cnn5_small", in_channels=1, projector="16-8"),
                    run_config=cfg.to_dict(), step=0, epoch=0)
    run.metrics.write_text("")
    out = tmp_path / "an"
    code = main(["analyze", str(run.root), "--data", _npz(tmp_path / "d.npz"), "--num-samples",
                 "0", "--knn-k", "5", "--quiet", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    page = (out / "report.html").read_text()
    runs = page[page.index("<h2>Runs</h2>"):page.index("<h2>Settings</h2>")]  # runs last
    assert "{&quot;" not in runs and "{\"" not in runs  # details as rows, not a JSON dump
    assert "<th>loss terms</th><td>none logged yet (empty metrics.jsonl)</td>" in runs
    assert "differences from preset fmnist-vicreg-continued" in runs
    assert "<tr><th>addon.name</th><td>none</td><td>e2mc</td></tr>" in runs
    assert "<tr><th>training.batch_size</th><td>256</td><td>32</td></tr>" in runs
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 1  # figures inline, the page stands alone
    assert html.unescape(page).count("<table") >= 3  # settings, run, statistics
    import json

    record = json.loads((out / "diagnostics.json").read_text())
    changed = record["runs"][0]["config_differences"]["changed"]
    assert changed["training.batch_size"] == {"base": 256, "run": 32}


def test_compare_writes_an_accuracy_chart(tmp_path):
    from matplotlib.image import imread

    from e2mc.evaluation.results import compare_evaluations, write_comparison
    from test_evaluation_cli import tiny_run

    a, b = tiny_run(tmp_path, "a", 0, 0.0), tiny_run(tmp_path, "b", 1, 1.0)
    comp = compare_evaluations([str(a), str(b)], n_resamples=50)
    paths = write_comparison(comp, tmp_path / "cmp")
    chart = tmp_path / "cmp.png"
    assert chart in paths and imread(chart).shape[0] > 100
    assert "![accuracy by run and column](cmp.png)" in (tmp_path / "cmp.md").read_text()


@pytest.mark.parametrize("data,name", [(None, "none"), ("/data/mnist", "MNIST"),
                                       ("/data/fashion-mnist", "Fashion-MNIST"),
                                       ("/data/kmnist", "kmnist"), ("builtin",
                                                                    "Fashion-MNIST (built-in "
                                                                    "subset)")])
def test_repro_transfer_column_is_named_after_its_data(data, name):
    from repro.page import transfer_name
    from repro.settings import ReproSettings

    assert transfer_name(ReproSettings(transfer_data=data)) == name
