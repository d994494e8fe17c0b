"""The optional wandb logger beside metrics.jsonl and TensorBoard (``logging.wandb: true``)."""

from __future__ import annotations

import sys
import types

import pytest

from e2mc.artifacts import RunDir
from e2mc.config import load_config
from e2mc.training.logging import MetricsLogger, wandb_run_id


class _FakeRun:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def log(self, data: dict, step: int) -> None:
        self.calls.append(("log", dict(data), step))

    def finish(self) -> None:
        self.calls.append(("finish",))


def test_wandb_gets_the_numeric_metrics_at_their_step(tmp_path, monkeypatch):
    """What the logger hands wandb: ``init`` arguments and one ``log`` per step with the finite
    numbers only (a stand-in module records the calls)."""
    calls: list = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or _FakeRun(calls)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = load_config("fmnist-vicreg-continued",
                      ["logging.wandb=true", "logging.wandb_mode=offline",
                       "logging.wandb_project=p", "name=my-run"])
    run_dir = tmp_path / "run"
    with MetricsLogger(run_dir, config=cfg) as logger:
        logger.log(0, {"loss": 2.0, "epoch": 0, "nonfinite": float("nan"), "flag": True,
                       "note": "text"})
        logger.log(5, {"loss": 1.5, "epoch": 1})
    init = calls[0][1]
    assert init["project"] == "p" and init["mode"] == "offline" and init["name"] == "run"
    assert init["dir"] == str(run_dir) and init["resume"] == "allow"
    assert init["id"] == wandb_run_id(RunDir(run_dir)) == wandb_run_id(RunDir(run_dir / "."))
    assert init["config"]["name"] == "my-run" and init["config"]["logging"]["wandb"] is True
    assert calls[1:] == [("log", {"loss": 2.0, "epoch": 0}, 0),
                         ("log", {"loss": 1.5, "epoch": 1}, 5), ("finish",)]
    assert len(RunDir(run_dir).read_metrics()) == 2  # metrics.jsonl is written as before


def test_wandb_off_by_default_and_a_clear_error_without_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with MetricsLogger(tmp_path / "a", config=load_config("fmnist-vicreg-continued")) as logger:
        logger.log(0, {"loss": 1.0})
    cfg = load_config("fmnist-vicreg-continued", ["logging.wandb=true"])
    with pytest.raises(ValueError, match=r"pip install 'e2mc\[wandb\]'"):
        MetricsLogger(tmp_path / "b", config=cfg)


@pytest.mark.slow  # wandb starts its service process: 10-40 s on a busy 2-core machine
def test_wandb_offline_run(tmp_path, monkeypatch):
    """A real wandb run in offline mode (``WANDB_MODE=offline``, files under the run
    directory): the run file holds the logged values and the configuration."""
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config("fmnist-vicreg-continued", ["logging.wandb=true"])
    run_dir = tmp_path / "run"
    with MetricsLogger(run_dir, config=cfg) as logger:
        for step in range(3):
            logger.log(step, {"loss": 1.0 / (step + 1), "epoch": 0})
    run_id = wandb_run_id(RunDir(run_dir))
    files = list((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert repr(1.0 / 3).encode() in data and b"fmnist-vicreg-continued" in data
