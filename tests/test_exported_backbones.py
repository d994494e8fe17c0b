"""Every file e2mc writes, e2mc reads back: a backbone exported by ``e2mc export-backbone`` (a
plain state dict and its ``OUT.json`` sidecar) of every architecture the package builds is
evaluated by ``e2mc eval OUT`` and continued by ``e2mc continue --from OUT --new-heads``, with
the exported tensors, not others; an image size the architecture cannot take is exit 2 with one
line naming both values, before any image is read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import EvalDir, RunDir
from e2mc.checkpoints import (
    load_backbone,
    load_checkpoint,
    read_sidecar,
    save_checkpoint,
    sidecar_path,
    torch_load,
)
from e2mc.cli import main
from e2mc.methods import build_method

#: Every architecture the package builds by name, at an image size it takes: ``(backbone,
#: image size, small_images)``. The slow ones are the large ResNets, ConvNeXt and timm's ViT.
ARCHITECTURES = [
    ("cnn5", 16, False),
    ("cnn5_small", 16, False),
    ("resnet18", 16, True),
    ("resnet34", 16, False),
    ("resnet50", 16, True),
    ("mobilenet_v3_small", 16, False),
    ("mobilenet_v3_large", 16, False),
    ("efficientnet_b0", 16, False),
    ("regnet_y_400mf", 16, False),  # built on the CPU: its constructor computes on tensors
    ("densenet121", 32, False),
    ("resnext50_32x4d", 16, False),
    pytest.param("wide_resnet50_2", 16, False, marks=pytest.mark.slow),
    pytest.param("resnet101", 16, False, marks=pytest.mark.slow),
    pytest.param("resnet152", 16, False, marks=pytest.mark.slow),
    pytest.param("convnext_tiny", 32, False, marks=pytest.mark.slow),
    ("timm:resnet18", 16, False),
    pytest.param("timm:vit_tiny_patch16_224", 32, False, marks=pytest.mark.slow),
]

#: ``e2mc continue`` of one step of 8 images (the starting model kept as epoch_0000.pt).
ONE_STEP = ["data.channels=1", "model.in_channels=1", "training.batch_size=8", "data.limit=8",
            "training.max_steps=1", "training.progress=false", "data.num_workers=0",
            "training.device=cpu", "training.cpu_threads=1", "training.log_every=1",
            "training.keep_epoch_checkpoints=true"]
QUICK_EVAL = ["--protocol", "knn", "--knn-k", "3", "--fractions", "1", "--seeds", "0",
              "--no-cache", "--quiet", "--device", "cpu"]


def _sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def _data(root: Path, size: int) -> Path:
    """40 training and 20 test images of ``size`` px in four classes (``.npz``)."""
    rng = np.random.default_rng(0)
    path = root / "d.npz"
    np.savez(path, x_train=rng.integers(0, 256, (40, size, size), dtype=np.uint8),
             y_train=np.arange(40) % 4,
             x_test=rng.integers(0, 256, (20, size, size), dtype=np.uint8),
             y_test=np.arange(20) % 4)
    return path


def _saved(root: Path, arch: str, size: int, small: bool) -> Path:
    """A project checkpoint of a VICReg model on ``arch`` (1 channel) that records its training
    image size, as a training run's does."""
    torch.manual_seed(0)
    model = build_method("vicreg", backbone=arch, in_channels=1, small_images=small,
                         projector="32-32")
    path = root / "c.pt"
    save_checkpoint(path, model, run_config={"data": {"image_size": size}})
    return path


def _assert_same(state: dict[str, torch.Tensor], exported: dict[str, torch.Tensor]) -> None:
    assert list(state) == list(exported)
    for key, value in exported.items():
        assert torch.equal(state[key], value), key


@pytest.mark.slow
@pytest.mark.parametrize("arch,size,small", ARCHITECTURES)
def test_an_exported_backbone_evaluates_and_continues(tmp_path: Path, arch: str, size: int,
                                                      small: bool) -> None:
    if arch.startswith("timm:"):
        pytest.importorskip("timm", reason="the [timm] extra is not installed")
    data = _data(tmp_path, size)
    bb = tmp_path / "bb.pt"
    assert main(["export-backbone", str(_saved(tmp_path, arch, size, small)), str(bb)]) == 0
    side = read_sidecar(bb)
    assert side is not None and side["arch"] == arch and side["image_size"] == size
    assert (side["in_channels"], side["small_images"]) == (1, small)
    exported = torch_load(bb)

    backbone, _, info = load_backbone(bb)  # what e2mc eval loads, through the sidecar
    _assert_same(backbone.state_dict(), exported)
    ev = tmp_path / "ev"
    assert main(["eval", str(bb), "--data", str(data), *QUICK_EVAL, "--out", str(ev)]) == 0
    results = EvalDir(ev).load()
    assert results.info["image_size"] == size  # the sidecar's, no --image-size given
    assert results.info["checkpoint_info"]["arch"] == arch

    run = tmp_path / "run"
    assert main(["continue", "--config", "fmnist-vicreg-continued", "--backbone", arch,
                 "--from", str(bb), "--new-heads", "--data", str(data), "--out", str(run),
                 *_sets([*ONE_STEP, f"data.image_size={size}",
                         f"model.small_images={str(small).lower()}",
                         "method.params={projector: 32-32}"])]) == 0
    start, _ = load_checkpoint(RunDir(run).epoch_checkpoint(0))  # the model the run started
    _assert_same(start.backbone.state_dict(), exported)
    assert load_checkpoint(run)[1]["step"] == 1


@pytest.mark.slow
def test_a_dino_vit_run_exports_evaluates_and_continues(tmp_path: Path, capsys) -> None:
    """The case of the issue: a DINO run on the package's vit_tiny_p4_28 (names ``class_token``,
    ``conv_proj``, ``encoder.*``, which no official layout explains) exported, evaluated on the
    shipped data at its 28 px, and continued from the export with new heads."""
    run = tmp_path / "run"
    assert main(["pretrain", "--config", "fmnist-dino-pretrain", "--data", "builtin",
                 "--out", str(run), *_sets(["data.limit=16", "training.batch_size=8",
                                                "training.max_steps=1", "data.num_workers=0",
                                                "training.progress=false",
                                                "training.device=cpu"])]) == 0
    bb = tmp_path / "bb.pt"
    assert main(["export-backbone", str(run), str(bb)]) == 0
    side = json.loads(sidecar_path(bb).read_text())
    assert (side["arch"], side["image_size"], side["in_channels"]) == ("vit_tiny_p4_28", 28, 1)
    exported = torch_load(bb)
    assert {k.split(".")[0] for k in exported} == {"class_token", "conv_proj", "encoder"}
    trained, _ = load_checkpoint(run)
    _assert_same(trained.backbone.state_dict(), exported)

    ev = tmp_path / "ev"
    assert main(["eval", str(bb), "--data", "builtin", *QUICK_EVAL, "--out", str(ev)]) == 0
    assert EvalDir(ev).load().info["image_size"] == 28
    analyze = ["analyze", str(bb), "--data", "builtin", "--num-samples", "64", "--knn-k", "5",
               "--quiet", "--device", "cpu", "--out", str(tmp_path / "an")]
    assert main(analyze) == 0  # (at the sidecar's 28 px)
    assert main([*analyze, "--image-size", "32"]) == 2

    cont = tmp_path / "cont"
    capsys.readouterr()
    assert main(["continue", "--config", "fmnist-dino-continued", "--from", str(bb),
                 "--new-heads", "--data", "builtin", "--out", str(cont),
                 *_sets(["data.limit=8", "training.batch_size=8", "training.max_steps=1",
                         "data.num_workers=0", "training.progress=false",
                         "training.device=cpu"])]) == 0, capsys.readouterr().err
    start, _ = load_checkpoint(RunDir(cont).epoch_checkpoint(0))
    _assert_same(start.backbone.state_dict(), exported)

    # the run's model must be the exported architecture: one line naming both
    capsys.readouterr()
    assert main(["continue", "--config", "fmnist-dino-continued", "--from", str(bb),
                 "--new-heads", "--backbone", "cnn5", "--data", "builtin",
                 "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "backbone=vit_tiny_p4_28" in err and "cnn5" in err and "--backbone vit_tiny_p4_28" \
        in err
    assert not (tmp_path / "other").exists()


def _bare_vit(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """An exported vit_tiny_p4_28 (1 channel), then its sidecar removed: a bare state dict."""
    bb = tmp_path / "vit.pt"
    assert main(["export-backbone", str(_saved(tmp_path, "vit_tiny_p4_28", 28, False)),
                 str(bb)]) == 0
    return bb, torch_load(bb)


def test_a_vit_state_dict_without_its_sidecar_loads_with_arch(tmp_path: Path, capsys) -> None:
    bb, exported = _bare_vit(tmp_path)
    sidecar_path(bb).unlink()
    data = _data(tmp_path, 28)
    capsys.readouterr()
    assert main(["eval", str(bb), "--data", str(data), *QUICK_EVAL,
                 "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--arch" in err and "cannot tell" in err
    backbone, _, _ = load_backbone(bb, arch="vit_tiny_p4_28", in_channels=1)
    _assert_same(backbone.state_dict(), exported)
    # no recorded size: the ViT's own 28 px, not 224
    assert main(["eval", str(bb), "--arch", "vit_tiny_p4_28", "--in-channels", "1",
                 "--data", str(data), *QUICK_EVAL, "--out", str(tmp_path / "ev")]) == 0
    assert EvalDir(tmp_path / "ev").load().info["image_size"] == 28
    run = tmp_path / "run"  # continue: the configured architecture reads it
    assert main(["continue", "--config", "fmnist-dino-continued", "--from", str(bb),
                 "--new-heads", "--data", str(data), "--out", str(run),
                 *_sets([*ONE_STEP, "data.image_size=28"])]) == 0
    _assert_same(load_checkpoint(RunDir(run).epoch_checkpoint(0))[0].backbone.state_dict(),
                 exported)


def test_a_sidecar_of_other_bytes_is_refused(tmp_path: Path, capsys) -> None:
    bb, exported = _bare_vit(tmp_path)
    torch.save({k: v + 1 for k, v in exported.items()}, bb)  # replaced after the export
    capsys.readouterr()
    assert main(["eval", str(bb), "--data", "builtin", *QUICK_EVAL,
                 "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "describes other bytes" in err
    assert str(sidecar_path(bb)) in err
    sidecar_path(bb).write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        load_backbone(bb)


def _one_error_line(capsys, argv: list[str], *needles: str) -> str:
    """``e2mc ARGV`` ends with exit 2 and one error line holding ``needles`` (before any image
    is read or any step is trained: the callers' data do not exist, so reading them would be
    another error)."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_an_image_size_the_vit_cannot_take_is_refused_before_any_work(tmp_path: Path,
                                                                       capsys) -> None:
    bb, _ = _bare_vit(tmp_path)
    missing = str(tmp_path / "no-such-data")  # never read: the size is refused first
    _one_error_line(capsys, ["eval", str(bb), "--data", missing, "--image-size", "32",
                             *QUICK_EVAL, "--out", str(tmp_path / "ev")],
                    "image size 32 px", "vit_tiny_p4_28", "28 px")
    _one_error_line(capsys, ["continue", "--config", "fmnist-dino-continued", "--from", str(bb),
                             "--new-heads", "--data", missing, "--out",
                             str(tmp_path / "run"), "--set", "data.image_size=32"],
                    "image size 32 px", "vit_tiny_p4_28", "28 px")
    assert not (tmp_path / "ev").exists() and not (tmp_path / "run").exists()


def test_a_patch_size_that_does_not_divide_the_image_size_is_refused(tmp_path: Path,
                                                                      capsys) -> None:
    """The issue's case: a patch-16 timm ViT at 28 px died after 40 s in an AssertionError."""
    pytest.importorskip("timm", reason="the [timm] extra is not installed")
    missing = str(tmp_path / "no-such-data")
    for command in (["continue", "--config", "fmnist-vicreg-continued", "--from",
                     str(tmp_path / "x.pt"), "--new-heads"],
                    ["pretrain", "--config", "fmnist-vicreg-pretrain"]):
        _one_error_line(capsys, [*command, "--backbone", "timm:vit_tiny_patch16_224",
                                 "--data", missing, "--out", str(tmp_path / "run"),
                                 "--set", "data.image_size=28"],
                        "image size 28 px", "patch size 16", "28", "timm:vit_tiny_patch16_224")
    # eval: the exported ViT at a size its patches do not divide
    torch.manual_seed(0)
    model = build_method("generic", backbone="timm:vit_tiny_patch16_224", in_channels=1,
                         projector="32-32")
    save_checkpoint(tmp_path / "vit16.pt", model, run_config={"data": {"image_size": 32}})
    assert main(["export-backbone", str(tmp_path / "vit16.pt"), str(tmp_path / "bb.pt")]) == 0
    _one_error_line(capsys, ["eval", str(tmp_path / "bb.pt"), "--data", missing,
                             "--image-size", "28", *QUICK_EVAL, "--out", str(tmp_path / "ev")],
                    "image size 28 px", "patch size 16")
    assert not (tmp_path / "run").exists() and not (tmp_path / "ev").exists()


def test_a_cnn_that_shrinks_the_image_to_nothing_is_refused(tmp_path: Path, capsys) -> None:
    _one_error_line(capsys, ["pretrain", "--config", "fmnist-vicreg-pretrain", "--backbone",
                             "densenet121", "--data", str(tmp_path / "no-such-data"),
                             "--out", str(tmp_path / "run"), "--set",
                             "data.image_size=16"],
                    "image size 16 px", "densenet121")


def test_torchvision_vit_export_reads_back_at_its_own_size(tmp_path: Path, capsys) -> None:
    """torchvision's ViT-B/16 (the layout of vit_tiny_p4_28, at 224 px only): exported, read
    back through its sidecar, and refused at another size before anything is evaluated."""
    torch.manual_seed(0)
    model = build_method("generic", backbone="vit_b_16", projector="32-32")
    save_checkpoint(tmp_path / "c.pt", model)
    bb = tmp_path / "bb.pt"
    assert main(["export-backbone", str(tmp_path / "c.pt"), str(bb)]) == 0
    backbone, dim, _ = load_backbone(bb)
    assert dim == 768
    _assert_same(backbone.state_dict(), torch_load(bb))
    _one_error_line(capsys, ["eval", str(bb), "--data", str(tmp_path / "no-such-data"),
                             "--image-size", "32", *QUICK_EVAL, "--out", str(tmp_path / "ev")],
                    "image size 32 px", "vit_b_16", "224 px")
