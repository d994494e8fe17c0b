"""The trainer: data order, learning-rate schedule, RNG state, non-finite losses (with a tiny
method), and whole runs through the real CLI (each method, each add-on, exact resume after a
kill, a starting checkpoint of another method)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import e2mc
from e2mc.artifacts import RunDir
from e2mc.config import RunConfig
from e2mc.distributed import Runtime
from e2mc.methods.base import MethodOutput, SSLMethod
from e2mc.optim import lr_factor
from e2mc.training.checkpointing import rng_state, set_rng_state
from e2mc.training.nonfinite import NonFiniteLossError
from e2mc.training.sampling import EpochBatchSampler
from e2mc.training.trainer import Trainer
from helpers import assert_same_training_state, killed_and_resumed, training_records

SRC = str(Path(e2mc.__file__).resolve().parents[1])
# One thread: on a busy 2-core machine two-thread kernels wait on each other (100x slower).
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------------------- units
def test_batches_are_a_pure_function_of_seed_and_epoch() -> None:
    whole = EpochBatchSampler(40, 8, seed=3)
    whole.set_epoch(2)
    batches = list(whole)
    assert len(batches) == 5 and all(len(b) == 8 for b in batches)
    assert len({i for b in batches for i, _ in b}) == 40  # a permutation: no repeats
    again = EpochBatchSampler(40, 8, seed=3)
    again.set_epoch(2, start_batch=3)
    assert list(again) == batches[3:]  # resume skips exactly the done batches
    other = EpochBatchSampler(40, 8, seed=3)
    other.set_epoch(1)
    assert [i for i, _ in next(iter(other))] != [i for i, _ in batches[0]]
    # two processes split every global batch into their halves, in rank order
    halves = []
    for rank in (0, 1):
        s = EpochBatchSampler(40, 8, seed=3, rank=rank, world_size=2)
        s.set_epoch(2)
        halves.append(list(s))
    assert [a + b for a, b in zip(*halves, strict=True)] == batches
    with pytest.raises(ValueError, match="not divisible"):
        EpochBatchSampler(40, 9, world_size=2)
    with pytest.raises(ValueError, match="fewer than one batch"):
        EpochBatchSampler(4, 8)


def test_lr_factor() -> None:
    assert [lr_factor(s, 100, "constant") for s in (0, 50, 99)] == [1.0, 1.0, 1.0]
    assert lr_factor(0, 100, "cosine", warmup_steps=10) == pytest.approx(0.1)
    assert lr_factor(9, 100, "cosine", warmup_steps=10) == pytest.approx(1.0)
    assert lr_factor(55, 100, "cosine", warmup_steps=10) == pytest.approx(0.5)
    assert lr_factor(100, 100, "cosine", 10, final_fraction=0.01) == pytest.approx(0.01)


def test_rng_state_round_trip() -> None:
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


# ----------------------------------------------------------------------------- tiny method
class Tiny(SSLMethod):
    """Linear encoder, invariance loss; its loss is NaN at the given forward calls."""

    name = "tiny"

    def __init__(self, nan_at: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 3)
        self.feature_dim = 3
        self.hparams = {}
        self.nan_at, self.calls = nan_at, 0

    def forward(self, views):
        z = [self.backbone(v) for v in views]
        loss = (z[0] - z[1]).pow(2).mean() - z[0].std(0).mean()
        self.calls += 1
        if self.calls in self.nan_at:
            loss = loss * float("nan")
        return MethodOutput(loss=loss, terms={"invariance": loss.detach()}, embeddings=z)

    def build_optimizer(self, lr, weight_decay, **kw):
        return torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return [self.x[i], self.x[i] + 0.1 * torch.randn(4)], 0


def _tiny_trainer(run_dir: Path, method: Tiny, skip: bool = False) -> Trainer:
    from e2mc.addons import build_addon

    cfg = RunConfig()
    cfg.training.batch_size, cfg.training.epochs, cfg.training.log_every = 4, 2, 1
    cfg.training.checkpoint_every_steps, cfg.training.progress = 1, False
    cfg.training.skip_nonfinite = skip
    cfg.optim.base_lr, cfg.optim.lr_scaling = 0.1, "none"
    return Trainer(method, build_addon("none"), Pairs(), cfg, run_dir,
                   runtime=Runtime(torch.device("cpu")))


def test_nonfinite_loss_stops_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteLossError, match=r"^loss is not finite at step 3 \(epoch 0"):
        _tiny_trainer(tmp_path, Tiny(nan_at=(3,))).fit()
    ckpt = tmp_path / "checkpoint.pt"
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    saved = torch.load(ckpt, weights_only=True)
    assert saved["step"] == 2 and all(torch.isfinite(v).all() for v in saved["model"].values())
    # running again resumes from step 2 and stops at the same place, file untouched
    with pytest.raises(NonFiniteLossError, match="step 3"):
        _tiny_trainer(tmp_path, Tiny(nan_at=(1,))).fit()
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest


def test_skip_nonfinite_counts_and_leaves_weights_alone(tmp_path: Path) -> None:
    method = Tiny(nan_at=(2, 5))
    result = _tiny_trainer(tmp_path, method, skip=True).fit()
    assert result.completed and result.step == 8 and result.skipped_steps == 2
    metrics = RunDir(tmp_path).read_metrics()
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert metrics[-1]["skipped_steps"] == 2 and not np.isfinite(metrics[1]["loss"])
    assert all(torch.isfinite(p).all() for p in method.parameters())


# ----------------------------------------------------------------------------- real CLI
TINY_MODEL = ["--set", "model.backbone=cnn5_small", "--set", "model.small_images=false",
              "--set", "model.in_channels=1", "--set", "data.image_size=16",
              "--set", "data.channels=1", "--set", "training.batch_size=8",
              "--set", "training.log_every=1", "--set", "training.progress=false",
              "--set", "training.precision=fp32", "--set", "data.num_workers=0",
              "--set", "training.device=cpu",
              "--set", "training.keep_epoch_checkpoints=false"]
METHOD_SETS = {
    "vicreg": ["--set", "method.params={projector: 32-32}"],
    "simsiam": ["--set", "method.params={dim: 32, pred_dim: 8, predictor_lr: 0.1}"],
    "swav": ["--set", "method.params={hidden_dim: 32, output_dim: 16, n_prototypes: 10, "
                      "queue_length: 16, queue_start_epoch: 0}"],
}
PRESET = {"vicreg": "fmnist-vicreg-e2mc", "simsiam": "fmnist-simsiam-e2mc",
          "swav": "fmnist-swav-e2mc"}
METHOD_HPARAMS = {"vicreg": {"projector": "32-32"},
                  "simsiam": {"dim": 32, "pred_dim": 8, "predictor_lr": 0.1},
                  "swav": {"hidden_dim": 32, "output_dim": 16, "n_prototypes": 10,
                           "queue_length": 16, "queue_start_epoch": 0}}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (24, 16, 16), dtype=np.uint8),
             y_train=rng.integers(0, 10, 24))
    return path


def _base_checkpoint(tmp_path: Path, method: str, epoch: int = 3) -> Path:
    from e2mc.checkpoints import save_checkpoint
    from e2mc.methods import build_method

    torch.manual_seed(1)
    model = build_method(method, backbone="cnn5_small", in_channels=1,
                         **METHOD_HPARAMS[method])
    path = tmp_path / f"{method}_base.pt"
    save_checkpoint(path, model, epoch=epoch)
    return path


def _cli(*args: str) -> int:
    from e2mc.cli import main

    return main(list(args))


CASES = [("vicreg", "e2mc"), ("simsiam", "e2mc"), ("swav", "none"), ("swav", "e2mc"),
         ("swav", "vcreg"), ("swav", "uniformity"), ("swav", "mmcr")]
ADDON_TERMS = {"e2mc": {"addon/entropy", "addon/covariance"}, "none": set(),
               "vcreg": {"addon/variance", "addon/covariance"},
               "uniformity": {"addon/uniformity"}, "mmcr": {"addon/nuclear_norm"}}
BASE_TERMS = {"vicreg": {"base/invariance", "base/variance", "base/covariance"},
              "simsiam": set(), "swav": set()}


@pytest.mark.parametrize("method, addon", CASES)
def test_one_epoch_of_continue_per_method_and_addon(tmp_path: Path, tiny_data: Path,
                                                    method: str, addon: str) -> None:
    base = _base_checkpoint(tmp_path, method)
    run = tmp_path / "run"
    rc = _cli("continue", "--config", PRESET[method], "--out", str(run), "--from", str(base),
              "--data", str(tiny_data), "--epochs", "1", *TINY_MODEL, *METHOD_SETS[method],
              "--set", f"addon.name={addon}", "--set", "addon.params={}")
    assert rc == 0
    metrics = RunDir(run).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]  # 24 images / batch 8
    names = set(metrics[-1])
    assert {"loss", "base/loss", "addon/loss", "lr", "images_per_s"} <= names
    assert ADDON_TERMS[addon] | BASE_TERMS[method] <= names
    assert all(np.isfinite(m["loss"]) for m in metrics)
    for m in metrics:  # the total is the base loss plus the add-on's
        assert m["loss"] == pytest.approx(m["base/loss"] + m["addon/loss"], rel=1e-5, abs=1e-6)
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert (ckpt["method"], ckpt["epoch"], ckpt["run_epoch"], ckpt["step"]) == (method, 4, 1, 3)
    assert ckpt["run_config"]["addon"]["name"] == addon
    start = torch.load(base, weights_only=True)["model"]
    changed = [k for k, v in ckpt["model"].items()
               if v.is_floating_point() and not torch.equal(v, start[k])]
    assert any(k.startswith("backbone.") for k in changed)
    assert (run / "config.yaml").is_file()
    if method == "swav":  # the queue is part of the checkpoint
        assert ckpt["training_state"]["queue"].shape == (2, 16, 16)


def test_resume_after_kill_gives_the_weights_of_an_uninterrupted_run(
        tmp_path: Path, tiny_data: Path) -> None:
    base = _base_checkpoint(tmp_path, "vicreg")
    args = ["continue", "--config", PRESET["vicreg"], "--from", str(base),
            "--data", str(tiny_data), "--epochs", "2", *TINY_MODEL, *METHOD_SETS["vicreg"],
            "--set", "training.checkpoint_every_steps=1", "--set", "data.num_workers=2"]
    a, b, killed = killed_and_resumed(args, tmp_path, ENV)
    assert_same_training_state(a, b)
    metrics_a, metrics_b = training_records(tmp_path / "whole"), training_records(killed)
    assert [m["step"] for m in metrics_b] == list(range(1, 7))  # each step logged once
    assert [m["loss"] for m in metrics_a] == [m["loss"] for m in metrics_b]


def test_checkpoint_of_another_method_gives_the_loaders_error(
        tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from e2mc.methods import build_method

    vicreg = build_method("vicreg", backbone="cnn5_small", in_channels=1, projector="32-32")
    official = tmp_path / "vicreg_official.pth"  # the official VICReg layout
    torch.save({"epoch": 5, "model": {f"module.{k}": v for k, v in vicreg.state_dict().items()}},
               official)
    common = ["--data", str(tiny_data), "--epochs", "1", *TINY_MODEL, *METHOD_SETS["swav"]]
    rc = _cli("continue", "--config", PRESET["swav"], "--out", str(tmp_path / "a"),
              "--from", str(official), *common)
    err = capsys.readouterr().err
    assert rc == 2 and "error: " in err and "Traceback" not in err
    assert "swav" in err.lower() or "vicreg" in err.lower()
    project = _base_checkpoint(tmp_path, "vicreg")
    rc = _cli("continue", "--config", PRESET["swav"], "--out", str(tmp_path / "b"),
              "--from", str(project), *common)
    err = capsys.readouterr().err
    assert rc == 2 and "'vicreg' model" in err
    assert not (tmp_path / "a" / "checkpoint.pt").exists()


def test_unknown_config_key_through_the_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "e2mc", "continue", "--config", "swav-e2mc",
                          "--out", str(tmp_path), "--set", "optim.lr=0.1"],
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown config key 'optim.lr'" in out.stderr and "base_lr" in out.stderr


def test_corrupt_image_is_named_or_skipped_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(15):
        folder = tmp_path / "images" / "train" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(folder / f"{i}.png")
    (tmp_path / "images" / "train" / "class0" / "broken.png").write_bytes(b"not a png")
    base = _base_checkpoint(tmp_path, "vicreg")
    args = ["continue", "--config", PRESET["vicreg"], "--from", str(base),
            "--data", str(tmp_path / "images"), "--epochs", "1", *TINY_MODEL,
            *METHOD_SETS["vicreg"]]
    assert _cli(*args, "--out", str(tmp_path / "a")) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "broken.png" in err and "Traceback" not in err
    with pytest.warns(UserWarning, match="skipped 1 corrupt"):
        assert _cli(*args, "--out", str(tmp_path / "b"), "--skip-corrupt") == 0
    err = capsys.readouterr().err
    assert "15 images (1 unreadable skipped)" in err
    assert [m["step"] for m in RunDir(tmp_path / "b").read_metrics()] == [1]  # 15 // 8 batches


def test_swav_resume_with_queue_is_exact(tmp_path: Path, tiny_data: Path) -> None:
    stop_at = 4  # in the middle of epoch 1: the queue is full and in use
    base = _base_checkpoint(tmp_path, "swav")
    args = ["continue", "--config", PRESET["swav"], "--from", str(base), "--data",
            str(tiny_data), "--epochs", "2", *TINY_MODEL, *METHOD_SETS["swav"]]
    assert _cli(*args, "--out", str(tmp_path / "whole")) == 0
    parted = tmp_path / "parted"
    assert _cli(*args, "--out", str(parted), "--set", f"training.max_steps={stop_at}") == 0
    assert torch.load(parted / "checkpoint.pt", weights_only=True)["step"] == stop_at
    assert _cli(*args, "--out", str(parted)) == 0
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)
    b = torch.load(parted / "checkpoint.pt", weights_only=True)
    assert torch.equal(a["training_state"]["queue"], b["training_state"]["queue"])
    assert a["training_state"]["use_the_queue"] == b["training_state"]["use_the_queue"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
