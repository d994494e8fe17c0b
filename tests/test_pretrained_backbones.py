"""Runs that start from pretrained weights named by the backbone (torchvision ``NAME:WEIGHTS``,
timm ``ARCH.TAG``) without ``--from``, from your own ``nn.Module`` (``continue_module``), and
from the shipped checkpoint by name (``builtin:demo-vicreg``). Nothing is downloaded: the
weights are placed where the libraries' caches look (torch.hub's ``checkpoints`` folder, the
Hugging Face hub's cache), and the tests check that the run started from exactly them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import e2mc
from e2mc.artifacts import BUILTIN_CHECKPOINTS, EvalDir, RunDir, builtin_checkpoint
from e2mc.checkpoints import load_checkpoint, torch_load
from e2mc.cli import main
from e2mc.evaluation.features import state_dict_digest
from helpers import TINY_RUN, tiny_base

#: A continued run of two steps on 16 px three-channel images, any backbone (``--set`` values).
TWO_STEPS = ["model.in_channels=3", "data.channels=3", "data.image_size=16",
             "method.params.projector=32-32", "training.batch_size=8", "training.max_steps=2",
             "training.log_every=1", "training.progress=false", "data.num_workers=0",
             "training.device=cpu", "training.cpu_threads=1"]
TV_NAME = "torchvision:mobilenet_v3_small:IMAGENET1K_V1"
TIMM_TAG = "test_resnet.r160_in1k"  # timm's test model (0.4 M parameters), weights on the hub
#: A proxy on a closed port: any download fails at once (no network is ever reached).
NO_NETWORK = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
              "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
              "no_proxy": "", "NO_PROXY": ""}


def _continue(data: Path, run: Path, backbone: str, *extra: str) -> list[str]:
    return ["continue", "--config", "fmnist-vicreg-continued", "--backbone", backbone,
            "--data", str(data), "--out", str(run),
            *[a for s in TWO_STEPS for a in ("--set", s)], *extra]


def _distinctive(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Random values for every float tensor (positive running variances)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        if v.is_floating_point():
            r = torch.randn(v.shape, generator=g)
            v = r.abs() + 0.5 if k.endswith("running_var") else r
        out[k] = v.clone()
    return out


def _start_backbone(run: Path) -> dict[str, torch.Tensor]:
    """The backbone of the run's step-0 model (``checkpoints/epoch_0000.pt``)."""
    state = torch_load(RunDir(run).epoch_checkpoint(0))["model"]
    return {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    return tiny_base(tmp_path)[1]


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """torch.hub's cache in a temporary folder (``$TORCH_HOME/hub/checkpoints``), offline."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    # urlopen builds its opener once, with the proxies of the environment at that moment:
    # this test's dead proxy must not stay in it for the tests after it (restored at the end)
    import urllib.request

    monkeypatch.setattr(urllib.request, "_opener", None)
    torch.hub.set_dir(str(tmp_path / "torch_home" / "hub"))
    yield tmp_path / "torch_home" / "hub" / "checkpoints"
    torch.hub.set_dir(str(Path(torch.hub._get_torch_home()) / "hub"))


@pytest.mark.slow
def test_torchvision_weights_start_a_continued_run(tmp_path, data):
    """``e2mc continue --backbone torchvision:NAME:WEIGHTS`` without ``--from`` (in a new
    process, ``TORCH_HOME`` set, offline) starts from the weights file in torch.hub's cache:
    the step-0 backbone is that file's state dict without the classifier, and start.json
    records the weights and the backbone's digest."""
    import torchvision.models as tvm

    url = tvm.MobileNet_V3_Small_Weights.IMAGENET1K_V1.url
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    placed = _distinctive(tvm.mobilenet_v3_small().state_dict(), seed=123)
    torch.save(placed, cache / Path(url).name)
    run = tmp_path / "run"
    src = str(Path(e2mc.__file__).resolve().parents[1])
    env = {**os.environ, **NO_NETWORK, "TORCH_HOME": str(tmp_path / "torch_home"),
           "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "e2mc", *_continue(data, run, TV_NAME)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    want = {k: v for k, v in placed.items() if not k.startswith("classifier.")}
    _assert_same(_start_backbone(run), want)
    reference = tvm.mobilenet_v3_small()
    reference.load_state_dict(placed)
    reference.classifier = nn.Identity()
    start = json.loads(RunDir(run).start.read_text())
    assert start["backbone_sha256"] == state_dict_digest(reference)
    assert start["checkpoint"] is None and start["from"] == f"pretrained weights {TV_NAME}"
    assert start["pretrained"] == {"backbone": TV_NAME, "library": "torchvision",
                                   "weights": "IMAGENET1K_V1", "cache": str(cache),
                                   "file": Path(url).name}
    assert "start: pretrained weights" in proc.stderr
    method, info = load_checkpoint(run)
    assert info["step"] == 2 and method.hparams["backbone"] == TV_NAME
    # resumed: built without fetching the weights again (the cached file is gone)
    (cache / Path(url).name).unlink()
    proc = subprocess.run([sys.executable, "-m", "e2mc",
                           *_continue(data, run, TV_NAME, "--set", "training.max_steps=3")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(run)[1]["step"] == 3


def _place_on_hf_hub(cache: Path, repo: str, state: dict[str, torch.Tensor]) -> None:
    """A repository's snapshot in the Hugging Face hub's cache layout."""
    import safetensors.torch

    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / "0123abc").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abc")
    safetensors.torch.save_file(state, folder / "snapshots" / "0123abc" / "model.safetensors")


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    """The Hugging Face hub's cache in a temporary folder, offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_timm_pretrained_tag_starts_a_continued_run(tmp_path, data, hf_cache, capsys):
    """``--backbone timm:ARCH.TAG`` without ``--from``: ``timm.create_model(...,
    pretrained=True)`` reads the tag's weights from the hub's cache; the step-0 backbone is
    exactly them (the classifier dropped). ``timm:ARCH`` without a tag stays random."""
    timm = pytest.importorskip("timm", reason="the [timm] extra is not installed")
    placed = _distinctive(timm.create_model(TIMM_TAG).state_dict(), seed=7)
    _place_on_hf_hub(hf_cache, f"timm/{TIMM_TAG}", placed)
    run = tmp_path / "run"
    assert main(_continue(data, run, f"timm:{TIMM_TAG}")) == 0, capsys.readouterr().err
    want = {k: v for k, v in placed.items() if not k.startswith("fc.")}
    _assert_same(_start_backbone(run), want)
    start = json.loads(RunDir(run).start.read_text())
    assert start["pretrained"] == {"backbone": f"timm:{TIMM_TAG}", "library": "timm",
                                   "weights": TIMM_TAG, "cache": str(hf_cache),
                                   "file": f"timm/{TIMM_TAG}"}
    # without a tag: random weights, and continue has no start
    capsys.readouterr()
    assert main(_continue(data, tmp_path / "r2", "timm:test_resnet")) == 2
    err = capsys.readouterr().err
    assert "continue needs a starting checkpoint (--from PATH" in err and "timm:ARCH.TAG" in err
    assert main(_continue(data, tmp_path / "r3", "timm:test_resnet.nosuchtag")) == 2
    assert "unknown timm pretrained tag 'test_resnet.nosuchtag'" in capsys.readouterr().err


def test_timm_tag_offline_with_an_empty_cache_is_one_error_line(tmp_path, data, hf_cache,
                                                                 capsys):
    pytest.importorskip("timm", reason="the [timm] extra is not installed")
    assert main(_continue(data, tmp_path / "run", f"timm:{TIMM_TAG}")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("e2mc continue: error: cannot load the pretrained weights of "
                          f"timm:{TIMM_TAG}: timm/{TIMM_TAG} is not in the cache {hf_cache}")


def test_torchvision_weights_offline_with_an_empty_cache_is_one_error_line(tmp_path, data,
                                                                          hub, capsys):
    assert main(_continue(data, tmp_path / "run", TV_NAME)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"e2mc continue: error: cannot load the pretrained weights of "
                          f"{TV_NAME}: mobilenet_v3_small-047dcff4.pth is not in the cache "
                          f"{hub} and fetching it failed (URLError")


@pytest.mark.parametrize("backbone,plain", [(TV_NAME, "mobilenet_v3_small"),
                                            (f"timm:{TIMM_TAG}", "timm:test_resnet")])
def test_weights_and_from_together_is_one_error_line(tmp_path, data, capsys, backbone, plain):
    """A backbone that names pretrained weights and a ``--from`` checkpoint: exit 2, one line
    (not one of them ignored); nothing is loaded or downloaded."""
    if backbone.startswith("timm:"):
        pytest.importorskip("timm", reason="the [timm] extra is not installed")
    start = tmp_path / "base.pt"  # (written with the data by tiny_base)
    run = tmp_path / "run"
    assert main(_continue(data, run, backbone, "--from", str(start))) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"e2mc continue: error: --backbone {backbone} names pretrained weights and "
                   f"--from {start} names a checkpoint: give one (the architecture without "
                   f"weights is --backbone {plain})")
    assert not RunDir(run).checkpoint.exists()


class TinyNet(nn.Module):
    """A user's own backbone: one convolution, pooled."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 12, 3, padding=1)
        self.bn = nn.BatchNorm2d(12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


def test_continue_module_with_monitor_and_keep_best(tmp_path, data):
    """``e2mc.training.continue_module``: a module of your own goes through the trainer with the
    monitor (every step) and keep-best; no step can beat the start (min_delta 1000 points), so
    best.pt holds exactly the module's weights; the module itself is not changed."""
    from e2mc.training import continue_module

    torch.manual_seed(5)
    module = TinyNet()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    run = tmp_path / "run"
    sets = [*TINY_RUN, f"data.dataset={data}", "data.val_split=0.2", "monitor.every=1",
            "monitor.keep_best=val/knn", "monitor.knn_k=3", "monitor.probe_epochs=2",
            "monitor.min_delta=1000", "training.max_steps=2"]
    result = continue_module(module, "fmnist-vicreg-e2mc", run, sets)
    assert result.step == 2
    files = RunDir(run)
    best = torch_load(files.best)
    assert best["step"] == 0
    kept = {k[len("backbone."):]: v for k, v in best["model"].items()
            if k.startswith("backbone.")}
    _assert_same(kept, before)
    _assert_same(module.state_dict(), before)  # copied, not trained in place
    steps = [r["step"] for r in files.read_metrics() if "val/knn" in r]
    assert steps == [0, 1, 2]
    start = json.loads(files.start.read_text())
    assert start["module"] == "TinyNet" and start["backbone_sha256"] == state_dict_digest(module)
    last = torch_load(files.checkpoint)
    assert last["hparams"]["backbone_class"] == "TinyNet" and last["hparams"]["feature_dim"] == 12
    # run again: resumes (nothing left to train) with the same module
    assert continue_module(TinyNet(), "fmnist-vicreg-e2mc", run, sets).step == 2
    # a module and a checkpoint: one start, not one of them ignored
    with pytest.raises(ValueError, match="a module to continue and init.checkpoint .* give one"):
        continue_module(TinyNet(), "fmnist-vicreg-e2mc", tmp_path / "r2",
                        [*sets, f"init.checkpoint={tmp_path / 'base.pt'}"])
    assert not (tmp_path / "r2" / "checkpoint.pt").exists()


def test_builtin_checkpoint_names_the_shipped_file(tmp_path, capsys):
    """``builtin:demo-vicreg`` wherever a checkpoint is accepted; an unknown name lists the
    builtin names (exit 2)."""
    path = builtin_checkpoint("builtin:demo-vicreg")
    assert path is not None and path.is_file() and path.name == "demo_base_vicreg.pt"
    assert builtin_checkpoint("demo_base_vicreg.pt") is None
    method, info = load_checkpoint("builtin:demo-vicreg")
    assert info["method"] == "vicreg" and method.hparams["backbone"] == "cnn5_small"
    out = tmp_path / "bb.pt"
    assert main(["export-backbone", "builtin:demo-vicreg", str(out)]) == 0
    assert json.loads((tmp_path / "bb.pt.json").read_text())["arch"] == "cnn5_small"
    _assert_same(torch.load(out, weights_only=True),
                 {k: v for k, v in method.backbone.state_dict().items()})
    capsys.readouterr()
    for argv in (["export-backbone", "builtin:nope", str(tmp_path / "x.pt")],
                 ["eval", "builtin:nope", "--data", "builtin", "--out", str(tmp_path / "e")],
                 ["analyze", "builtin:nope", "--data", "builtin", "--out", str(tmp_path / "a")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith("error: unknown builtin checkpoint 'builtin:nope'; builtin "
                            "checkpoints: " + ", ".join(f"builtin:{n}" for n in
                                                        BUILTIN_CHECKPOINTS)), err


@pytest.mark.slow  # ~20 s: a one-step continue, a kNN evaluation and an analysis
def test_builtin_checkpoint_in_continue_eval_and_analyze(tmp_path, capsys):
    import numpy as np

    from e2mc.data.datasets import builtin_fashion_mnist_path

    small = tmp_path / "small.npz"
    with np.load(builtin_fashion_mnist_path()) as f:
        np.savez(small, x_train=f["x_train"][:64], y_train=f["y_train"][:64],
                 x_test=f["x_test"][:32], y_test=f["y_test"][:32])
    run = tmp_path / "run"
    assert main(["continue", "--config", "fmnist-vicreg-continued", "--from",
                 "builtin:demo-vicreg", "--data", str(small), "--out", str(run),
                 "--set", "training.batch_size=16", "--set", "training.max_steps=1",
                 "--set", "training.progress=false", "--set", "data.num_workers=0"]) == 0
    start = json.loads(RunDir(run).start.read_text())
    assert start["checkpoint"] == "builtin:demo-vicreg"
    base, _ = load_checkpoint("builtin:demo-vicreg")
    _assert_same(_start_backbone(run), base.backbone.state_dict())
    assert main(["eval", "builtin:demo-vicreg", "--data", str(small), "--protocol", "knn",
                 "--knn-k", "5", "--fractions", "1", "--seeds", "0", "--image-size", "28",
                 "--no-cache", "--quiet", "--device", "cpu", "--out", str(tmp_path / "e")]) == 0
    info = EvalDir(tmp_path / "e").load().info
    assert info["checkpoint_file"] == str(builtin_checkpoint("builtin:demo-vicreg"))
    assert main(["analyze", "builtin:demo-vicreg", "--data", str(small), "--num-samples", "32",
                 "--knn-k", "5", "--quiet", "--device", "cpu",
                 "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "report.html").is_file()
