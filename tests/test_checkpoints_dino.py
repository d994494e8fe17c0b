"""Starting DINO from real checkpoint layouts, nothing downloaded: the official training
checkpoint (``student``, ``teacher``, ``dino_loss``, ``args``) of a ViT and of a ResNet, DINO's
backbone-only file (new heads, the teacher copied from the loaded student), and a DINOv2 backbone
by its timm name (the weights placed in the Hugging Face hub's cache, as timm looks for them)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from e2mc.checkpoints import load_backbone, load_checkpoint, load_official, load_start_model
from e2mc.checkpoints.strict import CheckpointMismatchError
from e2mc.cli import main
from e2mc.methods import build_method
from helpers import distinct_tensors

HEAD = {"out_dim": 40, "hidden_dim": 32, "bottleneck_dim": 16}


def _official(model, teacher_prefix=""):
    """The layout main_dino.py saves, made from a DINO model of this package."""
    sd = model.state_dict()
    student = {f"module.{k}": v.clone() for k, v in sd.items()
               if k.startswith(("backbone.", "head."))}
    teacher = {teacher_prefix + k[len("teacher."):]: v.clone() for k, v in sd.items()
               if k.startswith("teacher.")}
    args = argparse.Namespace(arch="vit_small", norm_last_layer=False, teacher_temp=0.07,
                              warmup_teacher_temp=0.04, warmup_teacher_temp_epochs=30,
                              momentum_teacher=0.996, clip_grad=3.0, freeze_last_layer=1)
    return {"student": student, "teacher": teacher, "epoch": 100, "args": args,
            "optimizer": {"state": {}, "param_groups": []},
            "dino_loss": {"center": sd["center"].clone()}}


def _assert_loaded(loaded, model):
    want = model.state_dict()
    got = loaded.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        if k != "teacher_initialized":
            assert torch.equal(got[k], v), k
    assert bool(got["teacher_initialized"])  # the file's teacher is kept


def test_official_vit_checkpoint_loads_student_teacher_and_centre(tmp_path: Path) -> None:
    pytest.importorskip("timm", reason="the [timm] extra is not installed")
    torch.manual_seed(0)
    model = distinct_tensors(build_method("dino", backbone="timm:test_vit", norm_last_layer=False,
                                   **HEAD))
    path = tmp_path / "dino_full_checkpoint.pth"
    torch.save(_official(model), path)  # teacher without module. (a ViT has no BatchNorm)
    loaded, info = load_official(path, method="dino", backbone="timm:test_vit")
    _assert_loaded(loaded, model)
    assert info["format"] == "dino" and info["epoch"] == 100 and info["optimizer"] is None
    hp = loaded.hparams  # read off the shapes and the run's args
    assert (hp["out_dim"], hp["bottleneck_dim"], hp["hidden_dim"], hp["nlayers"]) == (40, 16, 32,
                                                                                      3)
    assert (hp["teacher_temp"], hp["warmup_teacher_temp_epochs"]) == (0.07, 30)
    assert hp["norm_last_layer"] is False and loaded.head.last_layer.weight_g.requires_grad
    bad = _official(model)
    del bad["teacher"]["head.mlp.0.weight"]
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(CheckpointMismatchError, match="teacher.head.mlp.0.weight"):
        load_official(tmp_path / "bad.pth", method="dino", backbone="timm:test_vit")
    with pytest.raises(ValueError, match="official DINO layout"):
        load_official(path, method="byol", backbone="timm:test_vit")


def test_official_resnet_checkpoint_needs_no_arguments(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = distinct_tensors(build_method("dino", backbone="resnet18", **HEAD))
    path = tmp_path / "dino_resnet.pth"
    torch.save(_official(model, teacher_prefix="module."), path)  # DDP-wrapped teacher
    loaded, info = load_checkpoint(path)  # architecture and head read off the file
    assert loaded.hparams["backbone"] == "resnet18" and info["format"] == "dino"
    _assert_loaded(loaded, model)
    # what e2mc eval reads of it: the student's backbone
    backbone, dim, info = load_backbone(path)
    assert dim == model.feature_dim and info["format"] == "dino"
    for key, value in model.backbone.state_dict().items():
        assert torch.equal(backbone.state_dict()[key], value), key


def test_backbone_only_file_gets_new_heads_and_a_teacher_equal_to_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trained = distinct_tensors(build_method("dino", backbone="resnet18", **HEAD))
    path = tmp_path / "dino_resnet18_pretrain.pth"  # the teacher's backbone, bare names
    torch.save({k[len("teacher.backbone."):]: v for k, v in trained.state_dict().items()
                if k.startswith("teacher.backbone.")}, path)
    with pytest.raises(ValueError, match="--new-heads"):
        load_start_model(path, "dino", backbone="resnet18", **HEAD)
    model, info = load_start_model(path, "dino", new_heads=True, backbone="resnet18", **HEAD)
    assert info["new_heads"] == ["head"] and not bool(model.teacher_initialized)
    model.eval()
    model([torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)])
    placed = {k[len("teacher.backbone."):]: v for k, v in trained.state_dict().items()
              if k.startswith("teacher.backbone.")}
    for k, v in model.teacher["backbone"].state_dict().items():
        assert torch.equal(v, placed[k]), k
    for k, v in model.teacher["head"].state_dict().items():
        assert torch.equal(v, model.head.state_dict()[k]), k


@pytest.mark.slow  # a 22 M-parameter ViT written to and read from the hub cache
def test_dinov2_backbone_by_timm_name_starts_a_dino_run(tmp_path: Path, monkeypatch) -> None:
    timm = pytest.importorskip("timm", reason="the [timm] extra is not installed")
    constants = pytest.importorskip("huggingface_hub.constants")
    from e2mc.artifacts import RunDir
    from e2mc.checkpoints import torch_load
    from helpers import tiny_base
    from test_pretrained_backbones import _distinctive, _place_on_hf_hub

    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    tag = "vit_small_patch14_dinov2.lvd142m"  # backbone only: no classifier in the file
    placed = _distinctive(timm.create_model(tag.split(".")[0]).state_dict(), seed=5)
    _place_on_hf_hub(cache, f"timm/{tag}", placed)
    data = tiny_base(tmp_path)[1]
    run = tmp_path / "run"
    sets = ["model.in_channels=3", "data.channels=3", "data.image_size=28",
            "method.params={out_dim: 40, hidden_dim: 32, bottleneck_dim: 16}",
            "training.batch_size=8", "training.max_steps=2", "training.progress=false",
            "data.num_workers=0", "training.device=cpu", "training.log_every=1"]
    rc = main(["continue", "--config", "fmnist-dino-continued", "--backbone", f"timm:{tag}",
               "--data", str(data), "--out", str(run),
               *[a for s in sets for a in ("--set", s)]])
    assert rc == 0
    start = torch_load(RunDir(run).epoch_checkpoint(0))["model"]
    for k, v in placed.items():  # the student and the teacher start from the placed weights
        assert torch.equal(start[f"backbone.{k}"], v), k
    end = torch_load(RunDir(run).checkpoint)["model"]
    assert bool(end["teacher_initialized"])
    assert not torch.equal(end["teacher.backbone.pos_embed"], placed["pos_embed"])
