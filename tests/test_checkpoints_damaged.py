"""Checkpoint files that are damaged or hold non-finite weights (issue 47, items 1, 2 and 7):
every reader refuses them in one line, exit 2, before it writes anything; and the two fixes of
item 7 (``eval --arch`` names a MoCo v3 backbone its keys do not give; ``export-backbone``
checks both of its paths before it writes the first)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from e2mc.checkpoints import torch_load
from e2mc.cli import main
from e2mc.errors import CorruptFileError
from e2mc.methods import build_method
from helpers import TINY_RUN, tiny_base
from official_files import MOCO_RESNET, mocov3_file

EVAL = ["--protocol", "knn", "--knn-k", "3", "--image-size", "16", "--no-cache", "-q"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny project checkpoint and its data, and a MoCo v3 training file (main_moco.py's
    layout) of a cnn5_small backbone, which its keys do not name (``arch`` is "cnn5")."""
    root = tmp_path_factory.mktemp("damaged")
    ckpt, data = tiny_base(root)
    torch.manual_seed(0)
    moco = root / "checkpoint_0099.pth.tar"
    torch.save(mocov3_file(build_method("mocov3", backbone="cnn5_small", dim=8, mlp_dim=16),
                           "cnn5", MOCO_RESNET), moco)
    return {"project": ckpt, "data": data, "moco": moco}


def _error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The one ``error:`` line on stderr, holding each of ``words``."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _flipped(src: Path, dest: Path) -> Path:
    """The issue's damage: 4 KiB in the middle of the file inverted."""
    b = bytearray(src.read_bytes())
    m = len(b) // 2
    b[m:m + 4096] = bytes(x ^ 255 for x in b[m:m + 4096])
    dest.write_bytes(bytes(b))
    return dest


def _continue(start: Path, data: Path, run: Path, *sets: str) -> int:
    args = [a for item in [*TINY_RUN, *sets] for a in ("--set", item)]
    return main(["continue", "--config", "fmnist-vicreg-continued", "--from", str(start),
                 "--data", str(data), "--out", str(run), *args])


def _refused_everywhere(bad: Path, moco_bad: Path, files: dict[str, Path], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The error lines of eval (alone and in a set: compare's inputs), export-backbone and
    continue --from reading ``bad``, and of convert reading ``moco_bad``: each exits 2 with
    one line, and nothing is written."""
    data = str(files["data"])
    lines = []
    for args in (["eval", str(bad), "--data", data, "--out", str(tmp_path / "ev"), *EVAL],
                 ["eval", str(files["project"]), str(bad), "--data", data,
                  "--out", str(tmp_path / "set"), *EVAL],
                 ["export-backbone", str(bad), str(tmp_path / "bb.pt")],
                 ["convert", str(moco_bad), str(tmp_path / "m.pt"), "--backbone", "cnn5_small"]):
        assert main(args) == 2, args
        lines.append(_error(capsys))
    assert _continue(bad, files["data"], tmp_path / "run") == 2
    lines.append(_error(capsys))
    made = {"bb.pt", "bb.pt.json", "m.pt"} & {p.name for p in tmp_path.iterdir()}
    assert not made
    assert not (tmp_path / "ev" / "results.json").exists()
    # the set evaluated the good file before it read the bad one: only that one is there
    assert {p.parent.name.split("-")[0] for p in (tmp_path / "set").glob("*/results.json")} \
        == {files["project"].name}
    return lines


def test_a_zip_member_that_fails_its_crc_is_refused_by_every_reader(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _flipped(files["project"], tmp_path / "bad.pt")
    moco_bad = _flipped(files["moco"], tmp_path / "bad.pth.tar")
    member = zipfile.ZipFile(moco_bad).testzip()  # the witness: a member is named
    assert member is not None
    with pytest.raises(CorruptFileError, match=f"the bytes of {member} do not match"):
        torch_load(moco_bad)
    lines = _refused_everywhere(bad, moco_bad, files, tmp_path, capsys)
    for i in (0, 1, 2, 4):
        assert f"{bad}: damaged checkpoint file (the bytes of " in lines[i], lines[i]
    assert f"{moco_bad}: damaged checkpoint file (the bytes of {member} do not match their " \
           "CRC-32); download or write it again" in lines[3]


def test_a_run_checkpoint_damaged_on_disk_is_refused_on_resume(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert _continue(files["project"], files["data"], run, "training.max_steps=1") == 0
    checkpoint = run / "checkpoint.pt"
    before = checkpoint.read_bytes()
    _flipped(checkpoint, checkpoint)
    damaged = checkpoint.read_bytes()
    capsys.readouterr()
    assert _continue(files["project"], files["data"], run, "training.max_steps=2") == 2
    _error(capsys, str(checkpoint), "do not match their CRC-32")
    assert checkpoint.read_bytes() == damaged != before  # nothing trained, nothing written


@pytest.mark.parametrize("zip_format", [True, False])
def test_every_cut_of_a_checkpoint_is_refused_as_truncated(tmp_path: Path,
                                                           zip_format: bool) -> None:
    """A legacy (pickle) file cut anywhere was an IndexError, a struct.error, or advice to
    trust it; a zip archive cut anywhere loses its directory. Both are one CorruptFileError."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    whole = tmp_path / "whole.pth"
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, whole,
               _use_new_zipfile_serialization=zip_format)
    b = whole.read_bytes()
    assert torch.equal(torch_load(whole)["state_dict"]["0.weight"], model[0].weight)
    cut = tmp_path / "cut.pth"
    for n in range(4, len(b), 1 if not zip_format else 7):  # (after the magic number)
        cut.write_bytes(b[:n])
        with pytest.raises(CorruptFileError, match="truncated or damaged"):
            torch_load(cut, trust=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_by_every_reader(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        value: float) -> None:
    """Evaluated, the NaN file printed 'knn 10.00' with exit 0; now each reader names the first
    non-finite tensor by its name in the file."""
    state = torch.load(files["project"], weights_only=True)
    key = next(k for k, v in state["model"].items() if k.startswith("backbone.") and v.ndim == 4)
    state["model"][key] = torch.full_like(state["model"][key], value)
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    moco = torch.load(files["moco"], weights_only=True)
    moco["state_dict"]["module.base_encoder.0.weight"][0, 0, 0, 0] = value  # of 16 x 3 x 3 x 3
    moco_bad = tmp_path / "nan.pth.tar"
    torch.save(moco, moco_bad)
    n = state["model"][key].numel()
    lines = _refused_everywhere(bad, moco_bad, files, tmp_path, capsys)
    for i in (0, 1, 2, 4):
        assert lines[i].endswith(f"error: the checkpoint's {key} holds {n} of {n} values that "
                                 "are not finite (NaN or inf); nothing was loaded"), lines[i]
    assert "the checkpoint's module.base_encoder.0.weight holds 1 of 432 values that are not " \
           "finite" in lines[3]



def test_eval_names_a_backbone_the_keys_do_not_give_with_arch(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal named --backbone, which eval does not have; now it names --arch, and --arch
    builds the file's backbone (no 'ignored' warning)."""
    args = ["eval", str(files["moco"]), "--data", str(files["data"]), *EVAL]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    _error(capsys, "cannot tell the architecture of moco-v3's cnn5", "e2mc eval: --arch")
    assert main([*args, "--out", str(tmp_path / "b"), "--arch", "cnn5_small"]) == 0
    err = capsys.readouterr().err
    assert "ignored" not in err and "error" not in err
    assert (tmp_path / "b" / "results.json").is_file()


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_export_checks_both_paths_before_it_writes_the_first(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        planted: str) -> None:
    out, sidecar = tmp_path / "bb.pt", tmp_path / "bb.pt.json"
    target = tmp_path / "elsewhere.json"
    target.write_text("mine\n")
    if planted == "link":
        sidecar.symlink_to(target)
    else:
        sidecar.mkdir()
    assert main(["export-backbone", str(files["project"]), str(out)]) == 2
    _error(capsys, str(sidecar))
    assert not out.exists() and target.read_text() == "mine\n"
    assert sidecar.is_symlink() if planted == "link" else sidecar.is_dir()
