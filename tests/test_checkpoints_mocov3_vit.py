"""facebookresearch/moco-v3's ViT training checkpoints: a ViT's keys do not say its heads, so
the file's ``arch`` names the model (``vit_small``: timm's ViT-S/16 with 12 attention heads, not
timm's 6, named ``timm:vit_small_patch16_224(num_heads=12)``; ``vit_base``), the preset that
continues it builds the same, and the official ViTs' frozen patch projection and position
embedding stay frozen (``frozen_patch_embedding``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.checkpoints import load_checkpoint, load_official, restore_optimizer_state
from e2mc.checkpoints.layouts import MOCOV3_VIT_NAMES, HeadMismatchError
from e2mc.cli import main
from e2mc.config import load_config
from e2mc.methods import build_method
from helpers import distinct_tensors
from official_files import MOCO_RESNET, assert_same_tensors, mocov3_file, official_order

pytest.importorskip("timm", reason="the [timm] extra is not installed")

MOCO_VIT = [(src, dst.replace(".fc.", ".head.")) for src, dst in MOCO_RESNET]
VIT_S = "timm:vit_small_patch16_224(num_heads=12)"


def test_mocov3_vit_training_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    # MoCo_ViT: a 3-layer projector (base_encoder.head) and a predictor ending in a BatchNorm
    model = distinct_tensors(build_method("mocov3", backbone="timm:test_vit", dim=16, mlp_dim=32,
                                          projector_layers=3, predictor_last_bn=True))
    file = mocov3_file(model, "vit_test", MOCO_VIT)
    assert "module.base_encoder.head.6.weight" in file["state_dict"]
    assert "module.predictor.4.running_mean" in file["state_dict"]
    path = tmp_path / "vit_checkpoint.pth.tar"
    torch.save(file, path)
    with pytest.raises(ValueError, match="cannot tell the architecture"):
        load_official(path)  # a ViT's keys do not say its depth and heads
    out = tmp_path / "v.pt"
    assert main(["convert", str(path), str(out), "--backbone", "timm:test_vit"]) == 0
    loaded, _ = load_checkpoint(out)
    assert_same_tensors(loaded, model)
    assert (loaded.hparams["projector_layers"], loaded.hparams["predictor_last_bn"]) == (3, True)
    # moco-v3's vit_small has 12 attention heads: the same shapes with 2 heads are refused,
    # and test_vit's shapes are not ViT-S's (384 wide, patch 16, 12 blocks)
    file["arch"] = "vit_small"
    torch.save(file, tmp_path / "vit_small.pth.tar")
    with pytest.raises(HeadMismatchError, match="12 attention heads"):
        load_official(tmp_path / "vit_small.pth.tar", backbone="timm:test_vit")
    with pytest.raises(ValueError, match="cannot tell the architecture of moco-v3's vit_small"):
        load_official(tmp_path / "vit_small.pth.tar")


def test_mocov3_vit_small_loads_as_itself_and_the_preset_builds_it(tmp_path: Path) -> None:
    """A ViT-S/16 moco-v3 file (narrow heads: their widths are read off the file) loads without
    naming its backbone, with 12 heads; timm's 6-head ViT-S is refused; the preset's backbone is
    the same model, its patch embedding frozen, and the official AdamW state lands on the
    parameters that train."""
    torch.manual_seed(0)
    model = build_method("mocov3", backbone=VIT_S, dim=16, mlp_dim=32, projector_layers=3,
                         predictor_last_bn=True, frozen_patch_embedding=True)
    blocks = model.backbone.blocks
    assert (len(blocks), blocks[0].attn.num_heads, model.feature_dim) == (12, 12, 384)
    path = tmp_path / "checkpoint_0299.pth.tar"
    file = mocov3_file(model, "vit_small", MOCO_VIT, optimizer="adamw")
    torch.save(file, path)
    loaded, info = load_official(path)
    assert loaded.hparams["backbone"] == VIT_S == MOCOV3_VIT_NAMES["vit_small"][0]
    assert loaded.backbone.blocks[0].attn.num_heads == 12
    assert_same_tensors(loaded, model)
    with pytest.raises(HeadMismatchError, match="12 attention heads"):
        load_official(path, backbone="timm:vit_small_patch16_224")
    # the preset continues this model: the same backbone, the official frozen parts
    preset = load_config("mocov3-continued")
    assert preset.model.backbone == VIT_S
    assert preset.method.params["frozen_patch_embedding"] is True
    built = build_method("mocov3", backbone=preset.model.backbone,
                         **{**preset.method.params, "dim": 16, "mlp_dim": 32})
    frozen = {n for n, p in built.named_parameters()
              if not p.requires_grad and not n.startswith("teacher.")}
    assert frozen == {"backbone.pos_embed", "backbone.patch_embed.proj.weight",
                      "backbone.patch_embed.proj.bias"}
    built.load_state_dict(loaded.state_dict())
    optimizer = built.build_optimizer(lr=1e-6, weight_decay=0.1, optimizer="adamw")
    trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in trained for n, p in built.named_parameters() if n in frozen)
    assert restore_optimizer_state(optimizer, built, info["optimizer"]) == len(trained)
    order = official_order(model, MOCO_VIT)
    params = dict(built.named_parameters())
    for i, name in enumerate(order):
        if name in params and id(params[name]) in trained:
            assert float(optimizer.state[params[name]]["exp_avg"].flatten()[0]) == float(i)


def test_the_frozen_patch_embedding_does_not_move_in_a_step(tmp_path: Path) -> None:
    """One AdamW step with weight decay moves the blocks and leaves the patch projection and the
    position embedding (and a ResNet refuses the option in one line)."""
    torch.manual_seed(0)
    model = build_method("mocov3", backbone="timm:test_vit", dim=8, mlp_dim=16,
                         projector_layers=3, predictor_last_bn=True, frozen_patch_embedding=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = model.build_optimizer(lr=1e-2, weight_decay=0.1, optimizer="adamw")
    views = [torch.rand(4, 3, 32, 32) for _ in range(2)]
    model(views).loss.backward()
    optimizer.step()
    after = model.state_dict()
    for name in ("backbone.pos_embed", "backbone.patch_embed.proj.weight",
                 "backbone.patch_embed.proj.bias"):
        assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["backbone.blocks.0.attn.qkv.weight"],
                           before["backbone.blocks.0.attn.qkv.weight"])
    with pytest.raises(ValueError, match="frozen_patch_embedding needs a ViT backbone"):
        build_method("mocov3", backbone="resnet18", frozen_patch_embedding=True)


def test_timm_arguments_in_a_backbone_name() -> None:
    from e2mc.models import build_backbone, timm_parts

    assert timm_parts("vit_small_patch16_224.augreg_in21k(num_heads=12, qkv_bias=True)") == (
        "vit_small_patch16_224", "augreg_in21k", {"num_heads": 12, "qkv_bias": True})
    for bad, why in [("vit_small_patch16_224(num_heads=12", "end in"),
                     ("vit_small_patch16_224(12)", "KEY=VALUE"),
                     ("vit_small_patch16_224(num_heads=os.sep)", "KEY=VALUE"),
                     ("vit_small_patch16_224(**x)", "KEY=VALUE")]:
        with pytest.raises(ValueError, match=why):
            timm_parts(bad)
    with pytest.raises(ValueError, match="unexpected keyword argument 'no_such'"):
        build_backbone("timm:test_vit(no_such=1)")
    backbone, dim = build_backbone("timm:test_vit(embed_dim=24, num_heads=3)")
    assert dim == 24 and backbone.blocks[0].attn.num_heads == 3


def test_a_bad_timm_argument_is_one_error_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x_train=rng.integers(0, 256, (16, 16, 16), dtype=np.uint8),
             y_train=np.arange(16) % 4)
    code = main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(data),
                 "--out", str(tmp_path / "run"), "--backbone", "timm:test_vit(num_heads=",
                 "--set", "training.max_steps=1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "the arguments end in ')'" in err
