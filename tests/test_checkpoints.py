"""Official checkpoint layouts built here with the exact official names and shapes (ResNet-50,
full-size heads), loaded strictly; bad files; the project format; backbone export."""

import fractions
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision.models as tvm
from torch import nn

import e2mc
from e2mc.checkpoints import (
    CheckpointMismatchError,
    UntrustedCheckpointError,
    export_backbone,
    load_backbone,
    load_checkpoint,
    load_official,
    restore_optimizer_state,
    save_checkpoint,
)
from e2mc.methods import build_method


def resnet50_keys():
    """torchvision ResNet-50 parameter/buffer names and shapes without ``fc`` (no allocation)."""
    with torch.device("meta"):
        sd = tvm.resnet50(weights=None).state_dict()
    return {k: tuple(v.shape) for k, v in sd.items() if not k.startswith("fc.")}


def linear(prefix, out_f, in_f, bias=True):
    d = {f"{prefix}.weight": (out_f, in_f)}
    if bias:
        d[f"{prefix}.bias"] = (out_f,)
    return d


def bn(prefix, n, affine=True):
    d = {f"{prefix}.weight": (n,), f"{prefix}.bias": (n,)} if affine else {}
    d.update({f"{prefix}.running_mean": (n,), f"{prefix}.running_var": (n,),
              f"{prefix}.num_batches_tracked": ()})
    return d


def filled(spec):
    """A distinct constant per tensor (so every tensor's destination can be checked), stored as
    a broadcast view of one element: a 200M-value VICReg file takes no memory or disk."""
    out = {}
    for i, (k, shape) in enumerate(spec.items()):
        if k.endswith("num_batches_tracked"):
            out[k] = torch.tensor(i, dtype=torch.long)
        else:
            out[k] = torch.tensor(1.0 + i * 1e-3).expand(shape)
    return out


VICREG_SPEC = {**{f"module.backbone.{k}": s for k, s in resnet50_keys().items()},
               **linear("module.projector.0", 8192, 2048), **bn("module.projector.1", 8192),
               **linear("module.projector.3", 8192, 8192), **bn("module.projector.4", 8192),
               **linear("module.projector.6", 8192, 8192, bias=False)}
SWAV_SPEC = {**{f"module.{k}": s for k, s in resnet50_keys().items()},
             **linear("module.projection_head.0", 2048, 2048),
             **bn("module.projection_head.1", 2048),
             **linear("module.projection_head.3", 128, 2048),
             **linear("module.prototypes", 3000, 128, bias=False)}
SIMSIAM_SPEC = {**{f"module.encoder.{k}": s for k, s in resnet50_keys().items()},
                **linear("module.encoder.fc.0", 2048, 2048, bias=False),
                **bn("module.encoder.fc.1", 2048),
                **linear("module.encoder.fc.3", 2048, 2048, bias=False),
                **bn("module.encoder.fc.4", 2048),
                **linear("module.encoder.fc.6", 2048, 2048), **bn("module.encoder.fc.7", 2048,
                                                                   affine=False),
                **linear("module.predictor.0", 512, 2048, bias=False),
                **bn("module.predictor.1", 512), **linear("module.predictor.3", 2048, 512)}


def model_name(fmt, key):
    """Where each official key must land, written out per format."""
    key = key.removeprefix("module.")
    if fmt == "vicreg":
        return key
    if fmt == "swav":
        return key if key.startswith(("projection_head.", "prototypes.")) else f"backbone.{key}"
    if key.startswith("encoder.fc."):
        return "projector." + key.removeprefix("encoder.fc.")
    return "backbone." + key.removeprefix("encoder.") if key.startswith("encoder.") else key


def assert_landed(model, fmt, file_sd):
    model_sd = model.state_dict()
    assert len(model_sd) == len(file_sd)
    for k, v in file_sd.items():
        target = model_sd[model_name(fmt, k)]
        assert target.shape == v.shape and torch.equal(target, v.to(target.dtype)), k


def _exclude_bias_and_norm(p):  # pickled under VICReg's name, as in resnet50_fullckpt.pth
    return p.ndim == 1


def test_vicreg_fullckpt(tmp_path, monkeypatch):
    sd = filled(VICREG_SPEC)
    n_params = sum(1 for k in sd if not k.split(".")[-1].startswith(("running", "num_batches")))
    _exclude_bias_and_norm.__module__, _exclude_bias_and_norm.__qualname__ = \
        "__main__", "exclude_bias_and_norm"
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "exclude_bias_and_norm", _exclude_bias_and_norm, raising=False)
    optimizer = {"state": {0: {"mu": torch.tensor(7.0).expand(64, 3, 7, 7)}},
                 "param_groups": [{"lr": 0.0, "weight_decay": 1e-6, "momentum": 0.9,
                                   "eta": 0.001, "weight_decay_filter": _exclude_bias_and_norm,
                                   "lars_adaptation_filter": _exclude_bias_and_norm,
                                   "params": list(range(n_params))}]}
    path = tmp_path / "resnet50_fullckpt.pth"
    torch.save({"epoch": 1000, "model": sd, "optimizer": optimizer}, path)
    monkeypatch.delattr(main, "exclude_bias_and_norm")  # loading must not need it
    model, info = load_official(path)
    assert info["format"] == "vicreg" and info["epoch"] == 1000
    assert model.hparams["backbone"] == "resnet50" and model.hparams["projector"] == \
        "8192-8192-8192"
    assert_landed(model, "vicreg", sd)
    opt = model.build_optimizer(lr=0.006, weight_decay=1e-6)
    assert restore_optimizer_state(opt, model, info["optimizer"]) == 1
    conv1 = model.backbone.conv1.weight
    assert torch.equal(opt.state[conv1]["mu"], torch.full_like(conv1, 7.0))
    assert opt.param_groups[0]["lr"] == 0.006  # hyperparameters kept
    out = model.train()([torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)])
    assert [e.shape for e in out.embeddings] == [(2, 8192), (2, 8192)]


def test_swav_bare_state_dict(tmp_path):
    sd = filled(SWAV_SPEC)
    path = tmp_path / "swav_800ep_pretrain.pth.tar"
    torch.save(sd, path)
    model, info = load_official(path, method="swav", n_crops=(2, 2))
    assert info["format"] == "swav" and info["epoch"] is None and info["optimizer"] is None
    assert (model.hparams["hidden_dim"], model.hparams["output_dim"],
            model.hparams["n_prototypes"]) == (2048, 128, 3000)
    assert_landed(model, "swav", sd)
    views = [torch.randn(2, 3, 32, 32)] * 2 + [torch.randn(2, 3, 16, 16)] * 2
    out = model(views)
    assert [e.shape for e in out.all_embeddings] == [(2, 128)] * 4


def test_simsiam_checkpoint_with_optimizer(tmp_path):
    sd = filled(SIMSIAM_SPEC)
    params = [k for k in sd if not k.split(".")[-1].startswith(("running", "num_batches"))]
    n_enc = sum(k.startswith("module.encoder.") for k in params)
    optimizer = {"state": {i: {"momentum_buffer": torch.tensor(float(i)).expand(
        SIMSIAM_SPEC[k])} for i, k in enumerate(params)},
        "param_groups": [{"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "fix_lr": False,
                          "params": list(range(n_enc))},
                         {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "fix_lr": True,
                          "params": list(range(n_enc, len(params)))}]}
    path = tmp_path / "checkpoint_0099.pth.tar"
    torch.save({"epoch": 100, "arch": "resnet50", "state_dict": sd, "optimizer": optimizer},
               path)
    model, info = load_official(path)
    assert info["format"] == "simsiam" and info["epoch"] == 100 and info["arch"] == "resnet50"
    assert_landed(model, "simsiam", sd)
    assert not model.projector[6].bias.requires_grad  # frozen as in the official model
    opt = model.build_optimizer(lr=0.002, weight_decay=1e-4, predictor_lr=0.1)
    restored = restore_optimizer_state(opt, model, info["optimizer"])
    assert restored == len(params)
    named = dict(model.named_parameters())
    for i, k in enumerate(params):
        p = named[model_name("simsiam", k)]
        assert torch.equal(opt.state[p]["momentum_buffer"], torch.full_like(p, float(i))), k
    out = model([torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)])
    assert [e.shape for e in out.embeddings] == [(2, 2048), (2, 2048)]


def test_missing_extra_misshaped_keys_are_listed():
    sd = filled(SIMSIAM_SPEC)
    bad = dict(sd)
    del bad["module.predictor.0.weight"]
    bad["module.encoder.fc.9.weight"] = torch.zeros(3)
    bad["module.encoder.layer1.0.conv1.weight"] = torch.zeros(64, 64, 3, 3)
    with pytest.raises(CheckpointMismatchError) as err:
        load_official({"epoch": 1, "state_dict": bad})
    msg = str(err.value)
    assert "format assumed: simsiam" in msg
    assert "\n" not in msg  # one line: the counts and the first names of each kind
    assert "1 missing keys: module.predictor.0.weight" in msg
    assert "1 unexpected keys: module.encoder.fc.9.weight" in msg
    assert "1 shape mismatches: module.encoder.layer1.0.conv1.weight: file (64, 64, 3, 3)" \
        " vs model (64, 64, 1, 1)" in msg
    many = {k: v for i, (k, v) in enumerate(sd.items()) if not (k.startswith(
        "module.encoder.layer4.") and i % 2 == 0)}
    n_missing = len(sd) - len(many)
    with pytest.raises(CheckpointMismatchError, match=f"{n_missing} missing keys") as err:
        load_official({"epoch": 1, "state_dict": many})
    assert f"... and {n_missing - 10} more" in str(err.value)
    with pytest.raises(ValueError, match="official swav layout, not vicreg"):
        load_official(filled(SWAV_SPEC), method="vicreg")


def test_backbone_only_files(tmp_path):
    sd = filled({k: s for k, s in resnet50_keys().items()})
    path = tmp_path / "resnet50.pth"
    torch.save(sd, path)
    with pytest.raises(ValueError, match="backbone only"):
        load_official(path)
    with pytest.raises(ValueError, match="holds only a resnet50 backbone, no vicreg projector"
                                         r".*--new-heads"):
        load_official(path, method="vicreg", projector="64-32")
    model, info = load_official(path, method="vicreg", projector="64-32", new_heads=True)
    assert info["format"] == "backbone" and info["new_heads"] == ["projector"]
    bb = model.backbone.state_dict()
    assert all(torch.equal(bb[k], v.to(bb[k].dtype)) for k, v in sd.items())
    # a torchvision classification state dict: the classifier is dropped and reported
    torch.manual_seed(0)
    tv = tvm.resnet18(weights=None).state_dict()
    model, info = load_official(tv, method="simsiam", new_heads=True, dim=32, pred_dim=8)
    assert info["new_heads"] == ["predictor", "projector"]
    assert info["dropped_keys"] == ["fc.bias", "fc.weight"]
    assert torch.equal(model.backbone.conv1.weight, tv["conv1.weight"])
    bad = dict(sd)
    bad.pop("layer2.0.bn1.running_var")
    with pytest.raises(CheckpointMismatchError, match="layer2.0.bn1.running_var"):
        load_official(bad, method="vicreg", projector="8-8", new_heads=True)


class _Obj:
    pass


def test_untrusted_objects_need_trust(tmp_path):
    path = tmp_path / "pickled.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "note": fractions.Fraction(1, 3)}, path)
    with pytest.raises(UntrustedCheckpointError, match="trust=True"):
        load_checkpoint(path)
    with pytest.warns(UserWarning, match="full unpickling"), pytest.raises(ValueError):
        load_checkpoint(path, trust=True)  # unpickles, then fails as an unknown layout


def _small(name="simsiam", **kw):
    torch.manual_seed(0)
    args = {"simsiam": dict(dim=32, pred_dim=8), "vicreg": dict(projector="32-16"),
            "swav": dict(hidden_dim=16, output_dim=8, n_prototypes=5)}[name]
    return build_method(name, backbone="resnet18", **{**args, **kw})


def test_project_format_round_trip_is_atomic(tmp_path):
    model = _small("swav", small_images=True, in_channels=1, queue_length=8)
    model.set_epoch(0)
    path = tmp_path / "run" / "last.pt"
    save_checkpoint(path, model, epoch=3, step=42, training_state=model.training_state(),
                    config={"lr": 0.1})
    assert os.listdir(path.parent) == ["last.pt"]  # no temporary file left behind
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "e2mc" and raw["version"] == 1 and raw["method"] == "swav"
    loaded, info = load_checkpoint(path)
    assert info["epoch"] == 3 and info["step"] == 42 and info["config"] == {"lr": 0.1}
    assert info["hparams"] == model.hparams and "model" not in info
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b)
    loaded.load_training_state(info["training_state"])
    assert loaded.queue.shape == (2, 8, 8)
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(path, model, model={})
    raw["model"].pop("prototypes.weight")
    with pytest.raises(CheckpointMismatchError, match="e2mc"):
        load_checkpoint(raw)


def test_export_loads_strictly_into_torchvision(tmp_path):
    model = _small("vicreg").eval()
    out = tmp_path / "backbone.pt"
    meta = export_backbone(model, out)
    assert meta["arch"] == "resnet18" and meta["feature_dim"] == 512
    net = tvm.resnet18(weights=None)
    net.fc = nn.Identity()
    net.load_state_dict(torch.load(out, weights_only=True), strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(net.eval()(x), model.backbone(x))
    backbone, dim, info = load_backbone(out)
    assert dim == 512 and info["arch"] == "resnet18"
    torch.testing.assert_close(backbone.eval()(x), model.backbone(x))


def test_export_small_images_uses_sidecar(tmp_path):
    model = _small("simsiam", small_images=True, in_channels=1).eval()
    ckpt, out = tmp_path / "ckpt.pt", tmp_path / "bb.pt"
    save_checkpoint(ckpt, model)
    export_backbone(ckpt, out)
    assert json.loads(Path(f"{out}.json").read_text())["small_images"] is True
    backbone, dim, _ = load_backbone(out)
    x = torch.randn(2, 1, 16, 16)
    torch.testing.assert_close(backbone.eval()(x), model.backbone(x))
    os.remove(f"{out}.json")  # without the sidecar the ResNet is read off the shapes
    backbone, _, info = load_backbone(out)
    assert info["small_images"] and info["in_channels"] == 1
    with pytest.raises(CheckpointMismatchError, match="conv1.weight"):
        load_backbone(out, arch="resnet18")  # wrong stem given explicitly
    from e2mc.models import build_backbone
    torch.save(build_backbone("mobilenet_v3_small")[0].state_dict(), tmp_path / "m.pt")
    with pytest.raises(ValueError, match="arch="):
        load_backbone(tmp_path / "m.pt")
    _, dim, _ = load_backbone(tmp_path / "m.pt", arch="mobilenet_v3_small")
    assert dim == 576


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_cli_convert_and_export(tmp_path):
    model = _small("simsiam", small_images=True)
    sd = {}
    for k, v in model.state_dict().items():
        k = k.replace("projector.", "encoder.fc.", 1).replace("backbone.", "encoder.", 1)
        sd[f"module.{k}"] = v
    official = tmp_path / "checkpoint_0099.pth.tar"
    torch.save({"epoch": 99, "arch": "resnet18", "state_dict": sd, "optimizer": None}, official)
    env = {**os.environ, "PYTHONPATH": str(Path(e2mc.__file__).parents[1])}
    run = [sys.executable, "-m", "e2mc"]
    res = subprocess.run([*run, "convert", str(official), str(tmp_path / "c.pt"), "--method",
                          "simsiam"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded, info = load_checkpoint(tmp_path / "c.pt")
    assert info["epoch"] == 99 and info["source_format"] == "simsiam"
    assert torch.equal(loaded.predictor[3].weight, model.predictor[3].weight)
    res = subprocess.run([*run, "export-backbone", str(tmp_path / "c.pt"),
                          str(tmp_path / "b.pt")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    backbone, _, _ = load_backbone(tmp_path / "b.pt")
    assert torch.equal(backbone.conv1.weight, model.backbone.conv1.weight)
    res = subprocess.run([*run, "convert", str(official), str(tmp_path / "x.pt"), "--method",
                          "vicreg"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "official simsiam layout, not vicreg" in res.stderr
