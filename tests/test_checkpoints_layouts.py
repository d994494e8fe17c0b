"""Every family from its full training checkpoint, nothing downloaded: files laid out as
facebookresearch/moco-v3 (ResNet and ViT), facebookresearch/barlowtwins, solo-learn (a Lightning
``.ckpt``) and lightly save them, built here with their key names around small models
(ResNet-18, timm's ``test_vit``, narrow heads), converted or loaded strictly, and compared
tensor by tensor; heads of another architecture than e2mc's are refused in one line; the cheap
ones continue for a step through ``e2mc continue --from FILE``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from e2mc.checkpoints import (
    CheckpointMismatchError,
    load_backbone,
    load_checkpoint,
    load_official,
    restore_optimizer_state,
    save_checkpoint,
    torch_load,
)
from e2mc.checkpoints.layouts import HeadMismatchError
from e2mc.cli import main
from e2mc.methods import build_method
from helpers import distinct_tensors
from official_files import MOCO_RESNET, assert_same_tensors, mocov3_file, official_order, renamed

SMALL = {"backbone": "resnet18", "small_images": True, "in_channels": 1}


def _momenta(optimizer: torch.optim.Optimizer, method: nn.Module) -> dict[str, float]:
    """The restored momentum buffer of every parameter that has one (each a constant)."""
    out = {}
    for name, p in method.named_parameters():
        buffers = [v for v in optimizer.state.get(p, {}).values()
                   if isinstance(v, torch.Tensor) and v.shape == p.shape]
        if buffers:
            out[name] = float(buffers[0].flatten()[0])
    return out


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (16, 16, 16), dtype=np.uint8),
             y_train=np.arange(16) % 4, x_test=rng.integers(0, 256, (8, 16, 16), dtype=np.uint8),
             y_test=np.arange(8) % 4)
    return path


def _continue(tmp_path: Path, data: Path, preset: str, checkpoint: Path, params: str) -> int:
    """One step of ``e2mc continue --from checkpoint`` on 16 px single-channel images."""
    sets = ["model.backbone=resnet18", "model.small_images=true", "model.in_channels=1",
            "data.channels=1", "data.image_size=16", "training.batch_size=8",
            "training.max_steps=1", "training.progress=false", "data.num_workers=0",
            "training.device=cpu", "training.cpu_threads=1", "training.log_every=1",
            "training.precision=fp32", "training.keep_epoch_checkpoints=false",
            f"method.params={params}"]
    return main(["continue", "--config", preset, "--from", str(checkpoint), "--data", str(data),
                 "--out", str(tmp_path / "run"), *[a for s in sets for a in ("--set", s)]])


# --------------------------------------------------------------------------- MoCo v3 (ResNet)
def test_mocov3_resnet_training_checkpoint(tmp_path: Path, tiny_data: Path) -> None:
    torch.manual_seed(0)
    model = distinct_tensors(build_method("mocov3", **SMALL, dim=16, mlp_dim=32))
    path = tmp_path / "checkpoint_0099.pth.tar"
    torch.save(mocov3_file(model, "resnet18", MOCO_RESNET), path)
    assert main(["convert", str(path), str(tmp_path / "m.pt"), "--method", "mocov3"]) == 0
    loaded, info = load_checkpoint(tmp_path / "m.pt")
    assert_same_tensors(loaded, model)
    assert info["source_format"] == "mocov3" and info["epoch"] == 100
    hp = loaded.hparams  # read off the shapes: ResNet-18 small stem, 2-layer projector
    assert (hp["backbone"], hp["small_images"], hp["in_channels"]) == ("resnet18", True, 1)
    assert (hp["dim"], hp["mlp_dim"], hp["projector_layers"], hp["predictor_last_bn"]) == \
        (16, 32, 2, False)
    # the official LARS state, re-ordered into the model's parameters
    optimizer = loaded.build_optimizer(lr=0.1, weight_decay=0.0)
    restore_optimizer_state(optimizer, loaded, info["official_optimizer"])
    order = official_order(model, MOCO_RESNET)
    want = {n: float(i) for i, n in enumerate(order) if not n.startswith("teacher.")}
    assert _momenta(optimizer, loaded) == want
    # no --method: the layout is unambiguous
    same, info = load_official(path)
    assert info["format"] == "mocov3" and same.name == "mocov3"
    assert_same_tensors(same, model)
    with pytest.raises(ValueError, match="official mocov3 layout, not byol"):
        load_official(path, method="byol")
    bad = mocov3_file(model, "resnet18", MOCO_RESNET)
    del bad["state_dict"]["module.momentum_encoder.fc.0.weight"]
    torch.save(bad, tmp_path / "bad.pth.tar")
    with pytest.raises(CheckpointMismatchError, match=r"1 missing keys: module\.momentum_enc"
                       r"oder\.fc\.0\.weight"):
        load_official(tmp_path / "bad.pth.tar")
    assert _continue(tmp_path, tiny_data, "fmnist-mocov3-continued", path,
                     "{dim: 16, mlp_dim: 32}") == 0


# ------------------------------------------------------------------------------ Barlow Twins
def test_barlowtwins_training_checkpoint(tmp_path: Path, tiny_data: Path) -> None:
    torch.manual_seed(0)
    model = distinct_tensors(build_method("barlowtwins", **SMALL, projector="32-32-16"))
    sd = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
    assert "module.bn.running_mean" in sd and "module.bn.weight" not in sd  # non-affine
    # main.py's LARS: the weights, then the biases and norms (ndim 1), of model.parameters()
    params = list(model.named_parameters())
    weights = [n for n, p in params if p.ndim != 1]
    biases = [n for n, p in params if p.ndim == 1]
    order = weights + biases
    optimizer = {"state": {i: {"mu": torch.full_like(dict(params)[n], float(i))}
                           for i, n in enumerate(order)},
                 "param_groups": [{"params": list(range(len(weights))), "lr": 0.2,
                                   "weight_decay": 1.5e-6},
                                  {"params": list(range(len(weights), len(order))),
                                   "lr": 0.0048, "weight_decay": 1.5e-6}]}
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 1000, "model": sd, "optimizer": optimizer}, path)
    loaded, info = load_official(path)  # not taken for VICReg: the bn.* keys are Barlow Twins'
    assert info["format"] == "barlowtwins" and loaded.name == "barlowtwins"
    assert loaded.hparams["projector"] == "32-32-16"
    assert_same_tensors(loaded, model)
    opt = loaded.build_optimizer(lr=0.1, weight_decay=0.0)
    restore_optimizer_state(opt, loaded, info["optimizer"])
    assert _momenta(opt, loaded) == {n: float(i) for i, n in enumerate(order)}
    assert main(["convert", str(path), str(tmp_path / "b.pt"), "--method", "barlowtwins"]) == 0
    assert_same_tensors(load_checkpoint(tmp_path / "b.pt")[0], model)
    with pytest.raises(ValueError, match="official barlowtwins layout, not vicreg"):
        load_official(path, method="vicreg")
    assert _continue(tmp_path, tiny_data, "fmnist-barlowtwins-continued", path,
                     "{projector: 32-32-16}") == 0


# ------------------------------------------------------------------------------- solo-learn
SOLO = [("backbone.", "backbone."), ("projector.", "projector."),
        ("teacher.backbone.", "momentum_backbone."),
        ("teacher.projector.", "momentum_projector."), ("predictor.", "predictor.")]


def _lightning(state_dict: dict[str, torch.Tensor], classes: int = 10) -> dict:
    """A Lightning ``.ckpt`` as solo-learn's runs write it, with the online linear classifier
    (``classifier.*``) of its BaseMethod."""
    g = torch.Generator().manual_seed(7)
    feature_dim = state_dict["backbone.layer4.1.bn2.weight"].shape[0]
    classifier = {"classifier.weight": torch.randn(classes, feature_dim, generator=g),
                  "classifier.bias": torch.randn(classes, generator=g)}
    return {"epoch": 399, "global_step": 12345, "pytorch-lightning_version": "2.0.2",
            "state_dict": {**state_dict, **classifier}, "loops": {}, "callbacks": {},
            "optimizer_states": [{"state": {}, "param_groups": []}], "lr_schedulers": []}


@pytest.mark.filterwarnings("ignore:solo-learn's CIFAR stem")
def test_solo_learn_byol_checkpoint(tmp_path: Path, tiny_data: Path) -> None:
    torch.manual_seed(0)
    # solo-learn's BYOL: Linear (bias), BN, ReLU, Linear (bias) heads; a predictor wider than
    # the projector (pred_hidden_dim 8192 vs proj_hidden_dim 4096 in its ImageNet-100 runs)
    model = distinct_tensors(build_method("byol", **SMALL, hidden_dim=32, dim=16,
                                          pred_hidden_dim=48))
    path = tmp_path / "byol-solo.ckpt"
    torch.save(_lightning(renamed(model.state_dict(), SOLO)), path)
    with pytest.warns(UserWarning, match="pads its 3x3 conv1 by 2 pixels"):
        loaded, info = load_official(path)  # (its CIFAR stem; e2mc's pads by 1)
    assert info["format"] == "solo-learn" and loaded.name == "byol" and info["epoch"] == 399
    assert info["dropped_keys"] == ["classifier.weight", "classifier.bias"]
    assert info["optimizer"] is None  # solo-learn's parameter groups are not in model order
    hp = loaded.hparams
    assert (hp["hidden_dim"], hp["pred_hidden_dim"], hp["dim"], hp["hidden_bias"]) == \
        (32, 48, 16, True)
    assert_same_tensors(loaded, model)
    assert main(["convert", str(path), str(tmp_path / "s.pt"), "--method", "byol"]) == 0
    assert_same_tensors(load_checkpoint(tmp_path / "s.pt")[0], model)
    with pytest.raises(ValueError, match="solo-learn byol layout, not mocov3"):
        load_official(path, method="mocov3")
    assert _continue(tmp_path, tiny_data, "fmnist-byol-continued", path,
                     "{hidden_dim: 32, dim: 16, pred_hidden_dim: 48}") == 0


@pytest.mark.filterwarnings("ignore:solo-learn's CIFAR stem")
def test_solo_learn_simclr_head_is_refused_in_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    backbone = distinct_tensors(build_method("simclr", **SMALL, hidden_dim=32, dim=16)).backbone
    # solo-learn's SimCLR projector: Linear (bias), ReLU, Linear (bias); e2mc's has BatchNorms
    head = nn.Sequential(nn.Linear(512, 32), nn.ReLU(), nn.Linear(32, 16))
    sd = {**{f"backbone.{k}": v for k, v in backbone.state_dict().items()},
          **{f"projector.{k}": v for k, v in head.state_dict().items()}}
    path = tmp_path / "simclr-solo.ckpt"
    torch.save(_lightning(sd), path)
    with pytest.raises(HeadMismatchError) as err:
        load_official(path)  # the BatchNorm-free projector says SimCLR
    message = str(err.value)
    assert "\n" not in message and "nothing was loaded" in message
    assert "the file's projector is [0:Linear(bias) 2:Linear(bias)]" in message
    assert "e2mc's simclr projector [0:Linear 1:BatchNorm 3:Linear 4:BatchNorm(no affine)]" \
        in message
    assert main(["convert", str(path), str(tmp_path / "x.pt")]) == 2
    assert "the heads differ" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
    # --new-heads: its backbone alone, the projector new
    model, info = load_official(path, new_heads=True)
    assert info["new_heads"] == ["projector"]
    for k, v in backbone.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[k], v), k


# ----------------------------------------------------------------------------------- lightly
class _Head(nn.Module):
    """lightly's ``ProjectionHead`` where lightly is not installed: blocks ``(in, out,
    batch_norm, non_linearity)`` in ``layers``, a Linear without bias where a BatchNorm follows."""

    def __init__(self, blocks: list[tuple[int, int, nn.Module | None, nn.Module | None]]):
        super().__init__()
        layers: list[nn.Module] = []
        for d_in, d_out, norm, act in blocks:
            layers.append(nn.Linear(d_in, d_out, bias=not bool(norm)))
            layers += [m for m in (norm, act) if m is not None]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _byol_head(d_in: int, hidden: int, d_out: int) -> nn.Module:
    """lightly's ``BYOLProjectionHead`` / ``BYOLPredictionHead`` (the same blocks)."""
    try:
        from lightly.models.modules import BYOLProjectionHead
    except ImportError:
        return _Head([(d_in, hidden, nn.BatchNorm1d(hidden), nn.ReLU()),
                      (hidden, d_out, None, None)])
    return BYOLProjectionHead(d_in, hidden, d_out)


def _simclr_head(d_in: int, hidden: int, d_out: int) -> nn.Module:
    """lightly's ``SimCLRProjectionHead`` (2 layers, batch norms)."""
    try:
        from lightly.models.modules import SimCLRProjectionHead
    except ImportError:
        return _Head([(d_in, hidden, nn.BatchNorm1d(hidden), nn.ReLU()),
                      (hidden, d_out, nn.BatchNorm1d(d_out), None)])
    return SimCLRProjectionHead(d_in, hidden, d_out)


class _LightlyBYOL(nn.Module):
    """lightly's examples/pytorch/byol.py around a small-stem ResNet-18."""

    def __init__(self) -> None:
        super().__init__()
        resnet = build_method("simclr", **SMALL, hidden_dim=8, dim=8).backbone
        self.backbone = nn.Sequential(*list(resnet.children())[:-1])  # as lightly's examples
        self.projection_head = _byol_head(512, 32, 16)
        self.prediction_head = _byol_head(16, 32, 16)
        self.backbone_momentum = copy.deepcopy(self.backbone)
        self.projection_head_momentum = copy.deepcopy(self.projection_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prediction_head(self.projection_head(self.backbone(x).flatten(start_dim=1)))


def test_lightly_byol_checkpoint(tmp_path: Path, tiny_data: Path) -> None:
    torch.manual_seed(0)
    lightly = distinct_tensors(_LightlyBYOL())  # the momentum copies other than the online network
    sd = lightly.state_dict()
    assert "backbone.4.0.conv1.weight" in sd and "projection_head.layers.0.bias" not in sd
    path = tmp_path / "byol_lightly.pt"
    torch.save(sd, path)  # lightly's users save model.state_dict()
    loaded, info = load_official(path)
    assert info["format"] == "lightly" and loaded.name == "byol"
    assert loaded.hparams["hidden_bias"] is False
    got = loaded.state_dict()
    children = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3",
                "7": "layer4"}
    for k, v in sd.items():
        part, index, rest = k.split(".", 2)
        part = {"backbone": "backbone", "backbone_momentum": "teacher.backbone",
                "projection_head": "projector", "prediction_head": "predictor",
                "projection_head_momentum": "teacher.projector"}[part]
        name = (f"{part}.{children[index]}.{rest}" if "backbone" in part
                else f"{part}.{rest.removeprefix('layers.')}")
        assert torch.equal(got[name], v), k
    assert len(got) == len(sd) + 1 and bool(got["teacher_initialized"])
    x = torch.randn(4, 1, 16, 16)
    lightly.eval(), loaded.eval()  # the same network: the same predictions
    torch.testing.assert_close(loaded.predictor(loaded.projector(loaded.backbone(x))),
                               lightly(x))
    # e2mc eval reads its backbone
    backbone, dim, _ = load_backbone(path)
    assert dim == 512
    assert torch.equal(backbone.layer1[0].conv1.weight, sd["backbone.4.0.conv1.weight"])
    assert _continue(tmp_path, tiny_data, "fmnist-byol-continued", path,
                     "{hidden_dim: 32, dim: 16, hidden_bias: false}") == 0


def test_lightly_simclr_head_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    resnet = build_method("simclr", **SMALL, hidden_dim=8, dim=8).backbone
    resnet.fc = nn.Identity()
    model = nn.Module()
    model.backbone = resnet  # torchvision names, fc an Identity
    # SimCLRProjectionHead(512, 32, 16): the last BatchNorm has affine parameters, e2mc's not
    model.projection_head = _simclr_head(512, 32, 16)
    path = tmp_path / "simclr_lightly.pt"
    torch.save(distinct_tensors(model).state_dict(), path)
    with pytest.raises(HeadMismatchError, match=r"the file's projection_head\.layers is "
                       r"\[0:Linear 1:BatchNorm 3:Linear 4:BatchNorm\]"):
        load_official(path, method="simclr")
    loaded, info = load_official(path, method="simclr", new_heads=True)
    assert info["format"] == "lightly" and info["new_heads"] == ["projector"]
    assert torch.equal(loaded.backbone.conv1.weight, resnet.conv1.weight)


# ------------------------------------------------------------- the teacher's backbone, evaluated
def test_teacher_backbone_is_exported_and_evaluated(tmp_path: Path, tiny_data: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """``e2mc export-backbone --teacher``: DINO's teacher and MoCo v3's momentum encoder, from
    their official training checkpoints, as a backbone ``e2mc eval`` evaluates."""
    from test_checkpoints_dino import HEAD
    from test_checkpoints_dino import _official as dino_file

    torch.manual_seed(0)
    dino = distinct_tensors(build_method("dino", **SMALL, **HEAD))
    mocov3 = distinct_tensors(build_method("mocov3", **SMALL, dim=16, mlp_dim=32))
    files = {"dino": (tmp_path / "dino.pth", dino), "mocov3": (tmp_path / "moco.pth", mocov3)}
    torch.save(dino_file(dino, teacher_prefix="module."), files["dino"][0])
    torch.save(mocov3_file(mocov3, "resnet18", MOCO_RESNET), files["mocov3"][0])
    for name, (path, model) in files.items():
        out = tmp_path / f"{name}_teacher.pt"
        assert main(["export-backbone", str(path), str(out), "--teacher"]) == 0
        exported = torch_load(out)
        teacher = model.teacher["backbone"].state_dict()
        assert sorted(exported) == sorted(teacher)
        assert all(torch.equal(exported[k], v) for k, v in teacher.items())
        assert not torch.equal(exported["conv1.weight"], model.backbone.conv1.weight)
        assert json.loads(Path(f"{out}.json").read_text())["part"] == "teacher"
    rc = main(["eval", str(tmp_path / "dino_teacher.pt"), "--data", str(tiny_data),
               "--protocol", "knn", "--knn-k", "3", "--fractions", "1", "--seeds", "0",
               "--image-size", "16", "--device", "cpu", "--no-cache", "--quiet",
               "--out", str(tmp_path / "eval")])
    assert rc == 0 and (tmp_path / "eval" / "results.json").is_file()
    vicreg = tmp_path / "vicreg.pt"
    save_checkpoint(vicreg, build_method("vicreg", **SMALL, projector="16-16"))
    capsys.readouterr()
    assert main(["export-backbone", str(vicreg), str(tmp_path / "v.pt"), "--teacher"]) == 2
    assert "has no teacher" in capsys.readouterr().err
