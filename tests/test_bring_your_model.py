"""Bring any model: backbones by name (torchvision with weights enums, timm, Hugging Face),
checkpoints by URL (file:// and a local HTTP server, through torch.hub's cache with hash checks),
--new-heads for backbone-only files, and a generic run accepted by every subcommand."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from e2mc.checkpoints import fetch, load_checkpoint, load_start_model
from e2mc.checkpoints.remote import cache_path, is_url
from e2mc.cli import main
from e2mc.methods import VICReg, build_method
from e2mc.models import build_backbone, parse_backbone_name, weights_from_checkpoint


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """torch.hub's cache in a temporary folder (``$TORCH_HOME/hub/checkpoints``)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    torch.hub.set_dir(str(tmp_path / "torch_home" / "hub"))
    yield tmp_path / "torch_home" / "hub" / "checkpoints"
    torch.hub.set_dir(str(Path(torch.hub._get_torch_home()) / "hub"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- names
def test_backbone_names_parse():
    assert parse_backbone_name("resnet50") == ("torchvision", "resnet50", None)
    assert parse_backbone_name("torchvision:resnet50:IMAGENET1K_V2") == (
        "torchvision", "resnet50", "IMAGENET1K_V2")
    assert parse_backbone_name("timm:resnet50.a1_in1k") == ("timm", "resnet50.a1_in1k", None)
    assert parse_backbone_name("hf:facebook/dinov2-small") == ("hf", "facebook/dinov2-small",
                                                               None)


@pytest.mark.parametrize("name,hint", [
    ("resnet5", "did you mean resnet50"),
    ("torchvision:resnet18:IMAGENET", "did you mean IMAGENET1K_V1"),
    ("tim:resnet18", "did you mean timm:resnet18"),
    ("cnn5_smal", "did you mean cnn5_small"),
])
def test_unknown_names_list_close_matches(name, hint):
    with pytest.raises(ValueError, match=hint):
        build_backbone(name)


def test_unknown_method_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown method 'vicrge' \(did you mean vicreg"):
        build_method("vicrge")


def test_missing_extra_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match=r"pip install 'e2mc\[timm\]'"):
        build_backbone("timm:resnet18")
    with pytest.raises(ValueError, match=r"pip install 'e2mc\[hf\]'"):
        build_backbone("hf:some/model")


def test_torchvision_weights_enum_from_the_hub_cache(hub):
    """``torchvision:resnet18:IMAGENET1K_V1`` loads the enum's file through torch.hub's cache;
    a file already in the cache is not downloaded (nothing is fetched in the tests)."""
    import torchvision.models as tvm

    torch.manual_seed(3)
    reference = tvm.resnet18(weights=None)
    url = tvm.ResNet18_Weights.IMAGENET1K_V1.url
    hub.mkdir(parents=True)
    torch.save(reference.state_dict(), hub / Path(url).name)
    model, dim = build_backbone("torchvision:resnet18:IMAGENET1K_V1")
    assert dim == 512
    x = torch.randn(2, 3, 32, 32)
    reference.fc = nn.Identity()
    torch.testing.assert_close(model.eval()(x), reference.eval()(x))
    (hub / Path(url).name).unlink()  # rebuilt from a checkpoint: no weights are fetched
    with weights_from_checkpoint():
        build_backbone("torchvision:resnet18:IMAGENET1K_V1")
    with pytest.raises(ValueError, match="3-channel"):
        build_backbone("torchvision:resnet18:IMAGENET1K_V1", in_channels=1)


# ---------------------------------------------------------------- URLs
def test_fetch_file_url_with_sha256(tmp_path, hub):
    src = tmp_path / "weights-0000.pt"
    torch.save({"w": torch.arange(4.0)}, src)
    url = src.as_uri()
    assert is_url(url) and not is_url(str(src))
    with pytest.raises(ValueError, match="invalid hash value"):
        fetch(url, sha256="0" * 64, progress=False)
    assert not cache_path(url).exists()  # a bad download is not kept
    local = fetch(f"{url}#sha256={_sha256(src)}", progress=False)
    assert local == cache_path(url, _sha256(src)) and local.parent == hub
    assert local.name.endswith(f"-{src.name}") and local.read_bytes() == src.read_bytes()
    local.write_bytes(b"damaged")  # the cached copy is used, and checked against the hash
    with pytest.raises(ValueError, match="delete the file"):
        fetch(url, sha256=_sha256(src), progress=False)
    with pytest.raises(ValueError, match="hash prefix"):
        fetch((tmp_path / "plain.pt").as_uri(), check_hash=True, progress=False)
    with pytest.raises(ValueError, match="cannot download"):
        fetch((tmp_path / "missing.pt").as_uri(), progress=False)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture()
def http_server(tmp_path):
    """A local HTTP server on 127.0.0.1 serving ``tmp_path/www`` from a daemon thread; shut
    down at the end of the test (every request also times out after 10 s)."""
    root = tmp_path / "www"
    root.mkdir()
    _Quiet.requests = []
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.timeout = 10
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_checkpoint_from_a_local_http_server(http_server, hub):
    root, base = http_server
    model = VICReg("cnn5_small", in_channels=1, projector="16-8")
    data = {"epoch": 7, "model": {f"module.{k}": v for k, v in model.state_dict().items()}}
    torch.save(data, root / "vicreg-fullckpt.pth")
    digest = _sha256(root / "vicreg-fullckpt.pth")
    url = f"{base}/vicreg-fullckpt.pth#sha256={digest}"
    hp = {"backbone": "cnn5_small", "in_channels": 1, "projector": "16-8"}
    loaded, info = load_start_model(url, "vicreg", **hp)
    assert info["format"] == "vicreg" and info["epoch"] == 7 and info["source"] == url
    assert torch.equal(loaded.projector[0].weight, model.projector[0].weight)
    load_start_model(url, "vicreg", **hp)  # from the cache: one download only
    assert _Quiet.requests == ["/vicreg-fullckpt.pth"]
    with pytest.raises(ValueError, match="cannot download .*missing.pth: HTTP 404"):
        fetch(f"{base}/missing.pth", progress=False)


# ---------------------------------------------------------------- --new-heads
def test_backbone_only_file_needs_new_heads(tmp_path):
    backbone, _ = build_backbone("cnn5_small", in_channels=1)
    torch.save(backbone.state_dict(), tmp_path / "bb.pt")
    hp = {"backbone": "cnn5_small", "in_channels": 1, "projector": "16-8"}
    with pytest.raises(ValueError, match=r"bb.pt holds only a cnn5_small backbone, no vicreg "
                                         r"projector.*--new-heads"):
        load_start_model(tmp_path / "bb.pt", "vicreg", **hp)
    method, info = load_start_model(tmp_path / "bb.pt", "vicreg", new_heads=True, **hp)
    assert info["new_heads"] == ["projector"]
    assert all(torch.equal(a, b) for a, b in zip(method.backbone.state_dict().values(),
                                                  backbone.state_dict().values(), strict=True))


def test_generic_by_name_round_trips(tmp_path):
    from e2mc.checkpoints import save_checkpoint

    method = build_method("generic", backbone="cnn5_small", in_channels=1, projector="16-8",
                          loss="simsiam", predictor=4)
    save_checkpoint(tmp_path / "g.pt", method)
    loaded, info = load_checkpoint(tmp_path / "g.pt")
    assert info["method"] == "generic" and loaded.hparams == method.hparams
    views = [torch.randn(4, 1, 28, 28)] * 2
    method.eval(), loaded.eval()
    torch.testing.assert_close(loaded(views).loss, method(views).loss)


# ---------------------------------------------------------------- the CLI
def _official_vicreg(path: Path) -> VICReg:
    """A file with VICReg's official ``resnet50_fullckpt.pth`` layout (``module.backbone.*``,
    ``module.projector.*``, epoch, LARS state), here around a small CNN and projector."""
    torch.manual_seed(0)
    model = VICReg("cnn5_small", in_channels=1, projector="32-32")
    params = list(model.parameters())  # the official LARS: one group in parameters() order
    optimizer = {"state": {i: {"mu": torch.full_like(p, 0.01)} for i, p in enumerate(params)},
                 "param_groups": [{"params": list(range(len(params))), "lr": 0.2,
                                   "weight_decay": 1e-6, "momentum": 0.9, "eta": 0.001}]}
    torch.save({"epoch": 1000, "model": {f"module.{k}": v for k, v in
                                         model.state_dict().items()},
                "optimizer": optimizer}, path)
    return model


def _small_builtin(path: Path) -> str:
    """The first 100 training and 64 test images of the built-in data as an ``.npz`` file."""
    import numpy as np

    from e2mc.data.datasets import builtin_fashion_mnist_path

    with np.load(builtin_fashion_mnist_path()) as f:
        np.savez(path, x_train=f["x_train"][:100], y_train=f["y_train"][:100],
                 x_test=f["x_test"][:64], y_test=f["y_test"][:64])
    return str(path)


def test_continue_from_a_file_url_of_an_official_file(tmp_path, hub, capsys):
    """As ``e2mc continue --config vicreg-e2mc --from <official URL>``, with a file:// URL."""
    official = tmp_path / "resnet50_fullckpt.pth"
    model = _official_vicreg(official)
    run = tmp_path / "run"
    code = main(["continue", "--config", "vicreg-e2mc", "--from", official.as_uri(),
                 "--data", "builtin", "--out", str(run),
                 "--set", "model.backbone=cnn5_small", "--set", "model.in_channels=1",
                 "--set", "method.params.projector=32-32", "--set", "data.channels=1",
                 "--set", "data.image_size=28", "--set", "data.limit=16",
                 "--set", "training.precision=fp32",
                 "--set", "training.batch_size=8", "--set", "training.max_steps=1",
                 "--set", "training.progress=false", "--set", "data.num_workers=0"])
    assert code == 0, capsys.readouterr().err
    assert cache_path(official.as_uri()).is_file()
    trained, info = load_checkpoint(run / "checkpoint.pt")
    assert info["base_epoch"] == 1000  # read from the official file
    assert not torch.equal(trained.projector[0].weight, model.projector[0].weight)


@pytest.mark.slow  # ~30 s: two short runs and every subcommand on a timm ResNet-18
def test_timm_backbone_generic_run_and_every_subcommand(tmp_path, capsys):
    """``e2mc continue --backbone timm:resnet18 --from FILE --new-heads`` runs two steps on the
    built-in data; eval, analyze and export-backbone accept the run."""
    timm = pytest.importorskip("timm", reason="the [timm] extra is not installed")
    torch.manual_seed(0)
    weights = tmp_path / "resnet18_timm.pt"
    torch.save(timm.create_model("resnet18", num_classes=10, in_chans=1).state_dict(), weights)
    run = tmp_path / "run"
    args = ["continue", "--config", "fmnist-vicreg-continued", "--backbone", "timm:resnet18",
            "--from", str(weights), "--data", "builtin", "--out", str(run),
            "--set", "method.name=generic", "--set", "method.params.projector=32-32",
            "--set", "data.limit=64", "--set", "training.batch_size=16",
            "--set", "training.max_steps=2", "--set", "training.log_every=1",
            "--set", "training.progress=false", "--set", "data.num_workers=0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds only a timm:resnet18 backbone" in err and "--new-heads" in err
    assert main([*args, "--new-heads"]) == 0, capsys.readouterr().err
    method, info = load_checkpoint(run)
    assert info["method"] == "generic" and info["step"] == 2
    assert method.hparams["backbone"] == "timm:resnet18"
    assert main(["export-backbone", str(run), str(tmp_path / "bb.pt")]) == 0
    small = _small_builtin(tmp_path / "small.npz")  # eval and analyze on fewer images
    assert main(["eval", str(run), "--data", small, "--protocol", "knn", "--knn-k", "5",
                 "--fractions", "1", "--seeds", "0", "--image-size", "28",
                 "--cache", str(tmp_path / "cache"),  # the cache keys on the run's file
                 "--quiet", "--device", "cpu", "--out", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "results.json").is_file()
    assert main(["eval", str(tmp_path / "bb.pt"), "--data", small, "--protocol", "knn",
                 "--knn-k", "5", "--fractions", "1", "--seeds", "0", "--image-size", "28",
                 "--no-cache", "--quiet", "--device", "cpu",
                 "--out", str(tmp_path / "eval_bb")]) == 0
    assert main(["analyze", str(run), "--data", small, "--num-samples", "64", "--knn-k",
                 "5", "--quiet", "--device", "cpu", "--out", str(tmp_path / "an")]) == 0
    assert (tmp_path / "an" / "report.html").is_file()
    capsys.readouterr()
    assert main([*args, "--backbone", "timm:resnt18", "--out", str(tmp_path / "r2")]) == 2
    assert "did you mean resnet18" in capsys.readouterr().err


def test_hf_backbone_from_a_local_folder(tmp_path):
    transformers = pytest.importorskip("transformers",
                                       reason="the [hf] extra is not installed")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, num_channels=3)
    transformers.ViTModel(config).save_pretrained(tmp_path / "vit")
    model, dim = build_backbone(f"hf:{tmp_path / 'vit'}")
    assert dim == 32
    assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 32)
    with weights_from_checkpoint():  # built from the configuration alone
        again, _ = build_backbone(f"hf:{tmp_path / 'vit'}")
    again.load_state_dict(model.state_dict())
