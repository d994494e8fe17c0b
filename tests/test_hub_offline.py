"""Hub look-ups by name without a network: an unreachable hub fails within seconds in one line
(not after huggingface_hub's retries with backoff), a cached file still loads, and a misspelled
timm model or tag gets "did you mean". The hub's endpoint is a closed port on 127.0.0.1 or a
local HTTP server: no other address is ever asked."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest
import torch

from e2mc import hub
from e2mc.cli import main
from e2mc.models import build_backbone

timm = pytest.importorskip("timm", reason="the [timm] extra is not installed")
constants = pytest.importorskip("huggingface_hub.constants")

TIMM_TAG = "test_resnet.r160_in1k"  # timm's test model (0.4 M parameters), weights on the hub


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.fixture()
def dead_hub(tmp_path, monkeypatch):
    """An empty hub cache, not in offline mode, and an endpoint where nothing listens."""
    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    return cache


def test_an_unreachable_hub_fails_without_retrying_in_one_line(tmp_path, dead_hub, capsys,
                                                               monkeypatch):
    """huggingface_hub alone retries 5 times with backoff (1+2+4+8+8 s) per candidate file."""
    data = tmp_path / "d.npz"
    import numpy as np

    np.savez(data, x_train=np.zeros((8, 16, 16), np.uint8), y_train=np.arange(8) % 2,
             x_test=np.zeros((4, 16, 16), np.uint8), y_test=np.arange(4) % 2)
    waits: list[float] = []  # the hub library's backoff between retries
    monkeypatch.setattr(time, "sleep", waits.append)
    assert main(["continue", "--config", "fmnist-vicreg-continued", "--backbone",
                 f"timm:{TIMM_TAG}", "--data", str(data), "--out", str(tmp_path / "run"),
                 "--set", "data.image_size=16", "--set", "model.in_channels=3",
                 "--set", "data.channels=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Retrying" not in err
    assert err.startswith(f"e2mc continue: error: cannot load the pretrained weights of "
                          f"timm:{TIMM_TAG}: timm/{TIMM_TAG} is not in the cache {dead_hub} "
                          f"and the hub is unreachable ({constants.ENDPOINT} did not answer "
                          "(ConnectError"), err
    assert waits == [], waits  # (the retries would wait 1+2+4+8+8 s)
    assert constants.HF_HUB_OFFLINE is False  # offline only for the look-up


def test_an_unreachable_hub_still_loads_a_cached_file(dead_hub):
    import safetensors.torch

    placed = {k: torch.randn_like(v) if v.is_floating_point() else v
              for k, v in timm.create_model(TIMM_TAG).state_dict().items()}
    folder = dead_hub / f"models--timm--{TIMM_TAG}"
    (folder / "snapshots" / "0123abc").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abc")
    safetensors.torch.save_file(placed, folder / "snapshots" / "0123abc" / "model.safetensors")
    model, _ = build_backbone(f"timm:{TIMM_TAG}")
    got = model.state_dict()
    for k, v in got.items():
        assert torch.equal(v, placed[k]), k


def test_the_probe_asks_the_endpoint(monkeypatch):
    """A hub that answers (any status) is reachable; offline mode is a reason of its own."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        assert hub.unreachable() is None  # (the handler answers 501: still an answer)
    finally:
        thread.join(10)
        server.server_close()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub.unreachable() == "HF_HUB_OFFLINE is set"


@pytest.mark.parametrize("name,kind,close", [
    ("timm:resnt18", "timm model 'resnt18'", "resnet18"),
    ("timm:resnt18.a1_in1k", "timm model 'resnt18.a1_in1k'", "resnet18.a1_in1k"),
    ("timm:resnet18.a1_in1kk", "timm pretrained tag 'resnet18.a1_in1kk'", "resnet18.a1_in1k"),
])
def test_a_misspelled_timm_name_gets_did_you_mean(name, kind, close):
    with pytest.raises(ValueError) as info:
        build_backbone(name)
    message = str(info.value)
    assert message.startswith(f"unknown {kind} (did you mean {close},"), message


def test_an_hf_repo_with_an_unreachable_hub_is_looked_up_in_the_cache_only(dead_hub,
                                                                            monkeypatch):
    """``hf:REPO``: transformers' look-up runs in offline mode (a stand-in records the flag it
    saw and fails as transformers does on a file that is not in the cache)."""
    import sys
    import types

    seen = []

    def from_pretrained(repo, **kwargs):
        seen.append(constants.HF_HUB_OFFLINE)
        raise OSError(f"We couldn't connect to the hub to load {repo}\nand it is not cached.")

    fake = types.ModuleType("transformers")
    fake.AutoConfig = types.SimpleNamespace(from_pretrained=from_pretrained)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    with pytest.raises(ValueError) as info:
        build_backbone("hf:someone/tiny-vit")
    message = str(info.value)
    assert seen == [True] and constants.HF_HUB_OFFLINE is False
    assert "\n" not in message
    assert message.startswith(f"cannot load Hugging Face model 'someone/tiny-vit' (cache "
                              f"{constants.HF_HUB_CACHE}); the hub is unreachable "
                              f"({constants.ENDPOINT} did not answer (ConnectError"), message
