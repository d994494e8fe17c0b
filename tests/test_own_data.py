"""Your model on your data (issue 48): the folder presets take image size, channels and a batch
that leaves few images out from the data; your starting weights (a plain state dict) are the
base row of eval, evaluate_module, compare and analyze, named as such, never flagged as trained
with images left out; analyze leaves out the embeddings of heads a run started new."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torch import nn

from e2mc.cli import main
from e2mc.models import build_backbone
from e2mc.training.fit import MAX_LEFT_OUT, fit_batch
from helpers import one_column_eval_dir


def _folder(root: Path, per_class: int, test_per_class: int = 4, classes: int = 3,
            size: int = 32, mode: str = "RGB") -> Path:
    """``root/{train,test}/c<k>/<i>.png``: ``classes`` classes of ``size`` px images."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", test_per_class)):
        for c in range(classes):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(n):
                x = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(x).convert(mode).save(root / split / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize(("images", "largest", "batch"), [
    (450, 256, 225),    # the case: 256 left 194 of 450 out; 225 leaves none
    (500, 256, 250),
    (10_000, 256, 256),  # 16 left out: under 5 %
    (100, 256, 100),    # fewer than a batch: one batch of all
    (257, 256, 256),    # 1 left out: under 5 %
    (300, 256, 150),    # 256 would leave 44 (15 %) out
])
def test_the_fitted_batch_is_the_largest_that_leaves_at_most_5_percent_out(
        images: int, largest: int, batch: int) -> None:
    assert fit_batch(images, largest) == batch
    assert images % batch <= MAX_LEFT_OUT * images


def _state_dict_file(path: Path, in_channels: int = 3) -> Path:
    torch.manual_seed(0)
    backbone, _ = build_backbone("cnn5_small", False, in_channels)
    torch.save(backbone.state_dict(), path)
    return path


def test_the_folder_preset_takes_size_channels_and_batch_from_the_data(
        tmp_path: Path, capsys) -> None:
    """450 training images of 32 px RGB, 10 classes, and no --set about them: the run trains
    at 32 px on 3 channels with a batch of 225 (none left out), says so on its auto: line and
    fixes the values in its config.yaml."""
    data = _folder(tmp_path / "folder", 45, classes=10)
    base = _state_dict_file(tmp_path / "mine.pt")
    run = tmp_path / "run"
    assert main(["continue", "--config", "folder-e2mc", "--backbone", "cnn5_small",
                 "--from", str(base), "--new-heads", "--data", str(data), "--out", str(run),
                 "--set", "training.max_steps=1", "--quiet"]) == 0
    err = capsys.readouterr().err
    auto = next(line for line in err.splitlines() if line.startswith("auto: "))
    assert auto.startswith(
        "auto: data.image_size=32 (the data: 32 px RGB images, 10 classes); data.channels=3 "
        "(RGB images); model.in_channels=3 (data.channels); training.batch_size=225 (450 "
        "training images: 2 step(s) of 225 per epoch, 0 left out; at most 256); ")
    assert "left out of every epoch" not in err and "note: every epoch leaves" not in err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["data"]["image_size"], saved["data"]["channels"],
            saved["model"]["in_channels"], saved["training"]["batch_size"]) == (32, 3, 3, 225)
    # the same command again resumes the run: the data fit the same values
    assert main(["continue", "--config", "folder-e2mc", "--backbone", "cnn5_small",
                 "--from", str(base), "--new-heads", "--data", str(data), "--out", str(run),
                 "--set", "training.max_steps=2", "--quiet"]) == 0
    assert "training.batch_size=225" in capsys.readouterr().err


def test_grayscale_images_give_one_channel(tmp_path: Path, capsys) -> None:
    from e2mc.config import load_config
    from e2mc.training.fit import fit_to_data

    data = _folder(tmp_path / "gray", 10, size=20, mode="L")
    cfg, chosen = fit_to_data(load_config("folder-continued", [f"data.dataset={data}"]))
    assert (cfg.data.image_size, cfg.data.channels, cfg.model.in_channels,
            cfg.training.batch_size) == (20, 1, 1, 30)
    assert chosen["data.image_size"].reason == "the data: 20 px grayscale images, 3 classes"
    # a configuration that leaves nothing to its data is itself (the data are not read)
    fixed = load_config("fmnist-vicreg-continued", ["data.dataset=/no/such/data"])
    assert fit_to_data(fixed) == (fixed, {})


def test_a_plain_state_dict_is_evaluated_at_its_datas_size_and_named_the_start(
        tmp_path: Path, capsys) -> None:
    data = _folder(tmp_path / "folder", 8, classes=3, size=24)
    base = _state_dict_file(tmp_path / "mine.pt")
    assert main(["eval", str(base), "--arch", "cnn5_small", "--data", str(data), "--protocol",
                 "knn", "--knn-k", "3",
                 "--no-cache", "--quiet", "--device", "cpu", "--out",
                 str(tmp_path / "ev")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        f"model: {base}: starting weights, a plain state dict (not trained by e2mc)",
        f"note: {base} records no training image size; evaluating at 24 px, the size of the "
        f"images of {data} (--image-size sets it)"]
    import json

    assert json.loads((tmp_path / "ev" / "results.json").read_text())["image_size"] == 24


def test_a_base_that_was_never_trained_here_has_no_images_left_out(tmp_path: Path,
                                                                   capsys) -> None:
    """The issue's flag said "continued and e2mc and base were trained with 194 of their 450
    images left out": the base (a run's step 0, or your file) was never trained here."""
    use = {"images": 450, "batch": 256, "steps": 1, "dropped": 194}
    step0 = one_column_eval_dir(tmp_path / "step0", 150, info={
        "checkpoint": "runs/mine/checkpoints/epoch_0000.pt",
        "checkpoint_info": {"step": 0, "epoch_use": use}})
    plain = one_column_eval_dir(tmp_path / "plain", 150, info={
        "checkpoint": "mine.pt", "checkpoint_info": {"format": "backbone"}})
    trained = one_column_eval_dir(tmp_path / "trained", 160, info={
        "checkpoint": "runs/mine/checkpoint.pt",
        "checkpoint_info": {"step": 2, "epoch_use": use}})
    assert main(["compare", str(step0), str(plain), str(trained), "--names",
                 "step0,base,e2mc", "--out", str(tmp_path / "cmp"), "--resamples", "200"]) == 0
    flags = [line for line in capsys.readouterr().out.splitlines() if line.startswith("flag: ")]
    assert ("flag: step0 is a run's step 0 (runs/mine/checkpoints/epoch_0000.pt): its row is "
            "the weights the run started from, not trained ones") in flags
    assert "flag: base is mine.pt, a plain state dict: starting weights, not trained by e2mc" \
        in flags
    assert [f for f in flags if "left out" in f] == [
        "flag: e2mc was trained with 194 of its 450 images left out of every epoch (batch 256, "
        "1 step(s) per epoch; others each epoch)"]


class MyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_evaluate_module_takes_your_modules_own_state_dict(tmp_path: Path, capsys) -> None:
    from e2mc.evaluation import EvalOptions, evaluate_module

    data = _folder(tmp_path / "folder", 8, classes=3, size=16)
    torch.manual_seed(0)
    mine = MyEncoder()
    torch.save(mine.state_dict(), tmp_path / "my_encoder.pt")
    options = EvalOptions(protocols=("knn",), knn_k=(3,), device="cpu", progress=False)
    results = evaluate_module(MyEncoder(), tmp_path / "my_encoder.pt", str(data),
                              tmp_path / "ev", options)
    assert results is not None and results.info["image_size"] == 16
    assert results.info["checkpoint_info"]["format"] == "module"
    assert "starting weights, a plain state dict" in capsys.readouterr().err
    torch.save({"net.0.weight": torch.zeros(1)}, tmp_path / "other.pt")  # another shape
    with pytest.raises(ValueError, match="net.0.weight"):
        evaluate_module(MyEncoder(), tmp_path / "other.pt", str(data), tmp_path / "ev2",
                        options)


def test_analyze_leaves_out_the_embeddings_of_new_heads(tmp_path: Path, capsys) -> None:
    """Your file has no heads; a --new-heads run's step 0 has random ones: both are analysed
    by their backbone features, and the notes say why."""
    import torchvision

    data = _folder(tmp_path / "folder", 10, test_per_class=8, classes=3)
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18()  # (a plain state dict says its architecture)
    resnet.fc = nn.Identity()
    torch.save(resnet.state_dict(), base := tmp_path / "r18.pt")
    run = tmp_path / "run"
    assert main(["continue", "--config", "folder-continued", "--backbone", "torchvision:resnet18",
                 "--from", str(base), "--new-heads", "--data", str(data), "--out", str(run),
                 "--set", "training.max_steps=1", "--quiet"]) == 0
    step0 = run / "checkpoints" / "epoch_0000.pt"
    capsys.readouterr()
    assert main(["analyze", str(base), str(step0), str(run), "--data", str(data),
                 "--names", "base,step0,continued", "--num-samples", "24", "--knn-k", "5",
                 "--quiet", "--device", "cpu", "--out", str(tmp_path / "an")]) == 0
    err = capsys.readouterr().err
    assert (f"note: {base}: starting weights, a plain state dict (no heads); analysing "
            "backbone features only") in err
    assert (f"note: {step0}: step 0 of a run whose heads started new (random weights): "
            "analysing backbone features only") in err
