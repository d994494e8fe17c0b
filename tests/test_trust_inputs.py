"""Issue 22, the inputs a command trusts: checkpoint URLs cached by the whole URL, export-backbone
refusing to overwrite what it reads, a small ``checkpoint_info``, one ``error:`` line and exit 2
for bad input (state-dict mismatch, wrong-type parameters, an unwritable run directory), bounded
YAML (alias bombs, recursive aliases, duplicate keys), monitor options that do something, and a
pre-emption signal during start-up that ends with exit 75."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import threading
from pathlib import Path

import pytest
import torch
from tests.helpers import TINY_RUN

from e2mc.checkpoints import load_backbone, load_checkpoint, save_checkpoint
from e2mc.checkpoints.remote import cache_path, fetch
from e2mc.cli import main
from e2mc.config import load_config
from e2mc.errors import EXIT_INPUT, describe
from e2mc.methods import build_method
from e2mc.training.preemption import PREEMPTED_EXIT_CODE

SMALL = {"backbone": "cnn5_small", "in_channels": 1, "projector": "16-8"}
#: ``e2mc pretrain`` of a tiny model for two steps (seconds, should a refusal not happen).
PRETRAIN = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", "builtin",
            *[f"--set={o}" for o in TINY_RUN], "--set", "data.limit=16",
            "--set", "training.max_steps=2"]


def _vicreg(seed: int):
    torch.manual_seed(seed)
    return build_method("vicreg", **SMALL)


def _one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"e2mc {command}: error: "), err
    return lines[0]


@pytest.fixture()
def hub(tmp_path: Path):
    torch.hub.set_dir(str(tmp_path / "torch_home" / "hub"))
    yield tmp_path / "torch_home" / "hub" / "checkpoints"
    torch.hub.set_dir(str(Path(torch.hub._get_torch_home()) / "hub"))


# ------------------------------------------------------------------ item 5: URL cache key
def test_file_urls_with_the_same_file_name_load_their_own_weights(tmp_path, hub):
    a, b = tmp_path / "A" / "checkpoint.pt", tmp_path / "B" / "checkpoint.pt"
    a.parent.mkdir()
    b.parent.mkdir()
    save_checkpoint(a, _vicreg(1))
    save_checkpoint(b, _vicreg(2))
    first = next(iter(load_checkpoint(a)[0].state_dict().values()))
    second = next(iter(load_checkpoint(b)[0].state_dict().values()))
    assert not torch.equal(first, second)
    from_a, info_a = load_checkpoint(a.as_uri())
    from_b, info_b = load_checkpoint(b.as_uri())
    assert torch.equal(next(iter(from_a.state_dict().values())), first)
    assert torch.equal(next(iter(from_b.state_dict().values())), second)  # not A's weights
    assert info_a["source"] == a.as_uri() and info_b["source"] == b.as_uri()
    assert cache_path(a.as_uri()) != cache_path(b.as_uri())
    assert cache_path(a.as_uri()).name.endswith("checkpoint.pt")  # still recognisable
    # the sha256 is part of the key: another digest for the same URL is another entry
    from e2mc.files import sha256_file

    digest = sha256_file(b)
    assert fetch(f"{b.as_uri()}#sha256={digest}", progress=False).read_bytes() == b.read_bytes()
    with pytest.raises(ValueError, match="invalid hash value"):
        fetch(b.as_uri(), sha256="0" * 64, progress=False)
    _, bb_info = load_backbone(b.as_uri())[1:]
    assert bb_info["source"] == b.as_uri()


# ------------------------------------------------------------------ item 13: export-backbone
def test_export_backbone_refuses_to_overwrite_its_input(tmp_path, capsys):
    ckpt = tmp_path / "run" / "checkpoint.pt"
    ckpt.parent.mkdir()
    save_checkpoint(ckpt, _vicreg(0), optimizer={"state": {}, "param_groups": []}, step=3)
    before = ckpt.read_bytes()
    for out in (ckpt, tmp_path / "run" / "." / "checkpoint.pt"):
        assert main(["export-backbone", str(ckpt), str(out)]) == EXIT_INPUT
        line = _one_error_line(capsys.readouterr().err, "export-backbone")
        assert "is the checkpoint it reads" in line
    # a run directory stands for its latest checkpoint: the same file
    assert main(["export-backbone", str(ckpt.parent), str(ckpt)]) == EXIT_INPUT
    _one_error_line(capsys.readouterr().err, "export-backbone")
    # another training checkpoint is not overwritten either
    other = tmp_path / "other.pt"
    save_checkpoint(other, _vicreg(1))
    other_bytes = other.read_bytes()
    assert main(["export-backbone", str(ckpt), str(other)]) == EXIT_INPUT
    assert "e2mc checkpoint" in _one_error_line(capsys.readouterr().err, "export-backbone")
    assert ckpt.read_bytes() == before and other.read_bytes() == other_bytes
    assert not Path(f"{ckpt}.json").exists() and not Path(f"{other}.json").exists()
    # an earlier export is replaced
    out = tmp_path / "bb.pt"
    assert main(["export-backbone", str(ckpt), str(out)]) == 0
    assert main(["export-backbone", str(other), str(out)]) == 0
    capsys.readouterr()
    backbone = load_checkpoint(other)[0].backbone
    assert all(torch.equal(v, backbone.state_dict()[k]) for k, v in torch.load(out).items())


# ------------------------------------------------------------------ checkpoint_info
def test_checkpoint_info_of_a_training_checkpoint_holds_no_tensors(tmp_path):
    method = _vicreg(0)
    opt = method.build_optimizer(lr=0.1, weight_decay=0.0)
    views = [torch.randn(4, 1, 28, 28), torch.randn(4, 1, 28, 28)]
    method(views).loss.backward()
    opt.step()
    cfg = load_config("fmnist-vicreg-pretrain")
    save_checkpoint(tmp_path / "c.pt", method, optimizer=opt.state_dict(), step=5, epoch=2,
                    run_epoch=2, rng={"torch": torch.get_rng_state(),
                                      "python": (3, tuple(range(625)), None)},
                    run_config=cfg.to_dict(), addon={"name": "none", "state": {}},
                    training_state={"queue": torch.zeros(3, 4)})
    _, _, info = load_backbone(tmp_path / "c.pt")  # what results.json records as checkpoint_info
    text = json.dumps(info)
    assert "tensor(" not in text and len(text) < 8_000, text[:500]
    assert info["method"] == "vicreg" and info["step"] == 5 and info["epoch"] == 2
    assert info["run_config"]["method"]["name"] == "vicreg"
    assert len(info["sha256"]) == 64
    assert "optimizer" not in info and "rng" not in info and "training_state" not in info


# ------------------------------------------------------------------ one error line, exit 2
def test_state_dict_mismatch_is_one_error_line(tmp_path, capsys):
    save_checkpoint(tmp_path / "c.pt", _vicreg(0))
    obj = torch.load(tmp_path / "c.pt")
    for name in [k for k in obj["model"] if k.startswith("projector.")][:3]:
        del obj["model"][name]
    obj["model"]["bogus.weight"] = torch.zeros(2)
    torch.save(obj, tmp_path / "c.pt")
    code = main(["export-backbone", str(tmp_path / "c.pt"), str(tmp_path / "out.pt")])
    assert code == EXIT_INPUT
    line = _one_error_line(capsys.readouterr().err, "export-backbone")
    assert "3 missing keys" in line and "1 unexpected key" in line and "bogus.weight" in line
    assert not (tmp_path / "out.pt").exists()
    # any multi-line message becomes one line
    assert "\n" not in describe(ValueError("first\n  second"))[1]


@pytest.mark.parametrize("override", ["method.params.sim_coeff=abc",
                                      "method.params.sim_coeff=[1, 2]",
                                      "method.params.projector=[1]",
                                      "optim.params.momentum=abc",
                                      "addon.params.beta=abc"])
def test_wrong_type_parameter_is_bad_input(tmp_path, capsys, override):
    key = override.split("=")[0]
    code = main([*PRETRAIN, "--out", str(tmp_path / "run"), "--set", override,
                 *(["--set", "addon.name=e2mc"] if key.startswith("addon") else [])])
    assert code == EXIT_INPUT
    assert key in _one_error_line(capsys.readouterr().err, "pretrain")
    assert not (tmp_path / "run").exists()  # refused before anything was built


def test_numbers_written_as_text_are_converted():
    cfg = load_config("fmnist-vicreg-pretrain", ["method.params.sim_coeff=1e1",
                                                 "optim.params.momentum=0.5"])
    assert cfg.method.params["sim_coeff"] == 10.0 and cfg.optim.params["momentum"] == 0.5


def test_unwritable_run_directory_is_bad_input(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "mnt"
    parent.mkdir()
    run = [*PRETRAIN, "--out", str(parent / "run")]
    real_mkstemp = __import__("tempfile").mkstemp

    def read_only(*args, **kwargs):  # what a read-only file system answers
        where = kwargs.get("dir")
        if where is not None and Path(where).resolve().is_relative_to(parent.resolve()):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
        return real_mkstemp(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr("tempfile.mkstemp", read_only)
        assert main(run) == EXIT_INPUT
    line = _one_error_line(capsys.readouterr().err, "pretrain")
    assert str(parent) in line and "read-only file system" in line
    assert describe(OSError(errno.EROFS, "Read-only file system", "/x/y"))[0] == EXIT_INPUT
    if os.geteuid() != 0:  # root writes anywhere: the mode test needs another user
        parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            assert main(run) == EXIT_INPUT
            assert str(parent) in _one_error_line(capsys.readouterr().err, "pretrain")
        finally:
            parent.chmod(stat.S_IRWXU)


# ------------------------------------------------------------------ bounded YAML
#: "Billion laughs": nine levels of ten aliases each, 10**9 strings once expanded.
BOMB = "method:\n  params:\n    a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"    {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
    for i in range(8))


@pytest.mark.parametrize(("text", "match"), [
    (BOMB, "aliases"),
    ("method: {params: {a: &a [1, *a]}}\n", "recursive"),
    ("training: {epochs: 1}\nmodel: {in_channels: 1}\ntraining: {seed: 3}\n",
     "duplicate key 'training'"),
    ("training:\n  epochs: 1\n  epochs: 2\n", "duplicate key 'epochs'"),
])
def test_bad_yaml_config_is_refused_without_expanding(tmp_path, capsys, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    # a guard against a hang, not a speed test: expanded, the bomb's 10**9 strings take
    # minutes; refused, the call takes well under a second
    codes: list[int] = []
    call = threading.Thread(target=lambda: codes.append(main(["config", "show", str(path)])),
                            daemon=True)
    call.start()
    call.join(timeout=120)
    assert not call.is_alive(), "the configuration was still being read after 120 s"
    code, = codes
    assert code == EXIT_INPUT
    line = _one_error_line(capsys.readouterr().err, "config")
    assert match in line and "c.yaml" in line


def test_yaml_loader_keeps_merges_and_small_aliases():
    from e2mc.config import load_yaml_text

    data = load_yaml_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: [*b, *b]\n",
                          "t.yaml")
    assert data["other"] == {"x": 1, "y": 3} and data["list"] == [{"x": 1, "y": 2}] * 2
    with pytest.raises(ValueError, match="duplicate key"):
        load_yaml_text("{a: 1, a: 2}", "--set")
    with pytest.raises(ValueError, match="nested"):
        load_yaml_text("[" * 5000 + "]" * 5000, "deep.yaml")


# ------------------------------------------------------------------ monitor options
@pytest.mark.parametrize(("args", "match"), [
    (["--val-split", "0.1", "--monitor-every", "0"], "monitor.every must be >= 1"),
    (["--val-split", "0.1", "--patience", "3"], "monitor.patience"),
    (["--val-split", "0.1", "--set", "monitor.min_delta=0.5"], "monitor.min_delta"),
    (["--epochs", "0"], "training.epochs must be >= 1"),  # a 0 is given, not dropped
])
def test_monitor_options_that_would_be_ignored_are_errors(tmp_path, capsys, args, match):
    code = main([*PRETRAIN, "--out", str(tmp_path / "run"), *args])
    assert code == EXIT_INPUT
    line = _one_error_line(capsys.readouterr().err, "pretrain")
    assert match in line
    load_config("fmnist-vicreg-pretrain", ["data.val_split=0.1", "monitor.keep_best=val/knn",
                                           "monitor.patience=3", "monitor.every=2"])


# ------------------------------------------------------------------ SIGTERM during start-up
def test_sigterm_during_start_up_exits_75_and_the_next_run_starts(tmp_path, capsys,
                                                                  monkeypatch):
    import e2mc.training.run as run_module

    def refuse(signum, frame):  # the default action would end pytest: fail the test instead
        raise RuntimeError("the signal reached the previous handler")

    previous = signal.signal(signal.SIGTERM, refuse)
    real_build = run_module.build_train_dataset

    def build_while_signalled(*args, **kwargs):  # a scheduler's SIGTERM while loading the data
        signal.raise_signal(signal.SIGTERM)
        return real_build(*args, **kwargs)

    run_dir = tmp_path / "run"
    argv = [*PRETRAIN, "--out", str(run_dir)]
    try:
        with monkeypatch.context() as patch:
            patch.setattr(run_module, "build_train_dataset", build_while_signalled)
            code = main(argv)
        err = capsys.readouterr().err
        assert code == PREEMPTED_EXIT_CODE, err
        assert "pre-empted by SIGTERM" in err and "before the first step" in err
        assert not (run_dir / "checkpoint.pt").exists()  # nothing was trained
        assert signal.getsignal(signal.SIGTERM) is refuse  # the handlers are restored
        assert main(argv) == 0  # the next run simply starts
        assert load_checkpoint(run_dir)[1]["step"] == 2
    finally:
        signal.signal(signal.SIGTERM, previous)
