"""A result is bound to the bytes it came from, and e2mc writes only what it owns (issue 31).

One test per numbered item of the issue, each asserting what a user sees: the number, the file,
the exit code and the one-line message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import LOCK, EvalDir, RunDir
from e2mc.artifacts.layout import read_jsonl
from e2mc.cli import main
from e2mc.config import load_config
from e2mc.data.identity import data_identity
from helpers import TINY_RUN, tiny_base

EVAL = ["--protocol", "knn", "--knn-k", "3", "--knn-weighting", "weighted", "--image-size",
        "16", "--no-cache", "-q"]


def _one_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(line) == 1, err
    for word in words:
        assert word in line[0], line[0]
    return line[0]


def _rewrite_test_images(data: Path, seed: int) -> None:
    """The same labels, counts and classes at the same path; other test images."""
    with np.load(data) as f:
        arrays = dict(f)
    arrays["x_test"] = np.random.default_rng(seed).integers(0, 256, arrays["x_test"].shape,
                                                              dtype=np.uint8)
    np.savez(data, **arrays)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_base(tmp_path_factory.mktemp("bytes"))


def _knn(out: Path) -> float:
    return EvalDir(out).load().values("knn k=3")[0]


# ----------------------------------------------------------------------------- item 1
def test_compare_refuses_evaluations_of_other_test_images(base, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    other = tmp_path / "other.npz"
    other.write_bytes(data.read_bytes())
    _rewrite_test_images(other, seed=7)
    for name, where in (("a", data), ("a2", data), ("b", other)):
        assert main(["eval", str(checkpoint), "--data", str(where), "--out",
                     str(tmp_path / name), *EVAL]) == 0
    results = EvalDir(tmp_path / "a").load().info
    assert results["test_data"]["size"] == 20 and results["train_data"]["size"] == 40
    capsys.readouterr()
    # the same images evaluated twice pair (the control) ...
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a2"), "--out",
                 str(tmp_path / "c")]) == 0
    capsys.readouterr()
    # ... other images with the same labels never do, not even with --allow-mismatch
    for extra in ([], ["--allow-mismatch"]):
        assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                     str(tmp_path / "d"), *extra]) == 2
        _one_error(capsys, "cannot pair b with a", "other test images", "the images differ")
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------------------- item 2
def test_an_evaluation_set_evaluates_new_images_at_the_same_paths_anew(
        base, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    mine = tmp_path / "d.npz"
    mine.write_bytes(data.read_bytes())
    out = tmp_path / "set"
    args = ["eval", str(checkpoint), "builtin:demo-vicreg", "--data", str(mine), "--out",
            str(out), *EVAL]
    assert main(args) == 0
    name = json.loads((out / "evaluations.json").read_text())["checkpoints"]
    first = next(n for n, ref in name.items() if ref == str(checkpoint))
    before = EvalDir(out / first).load().info["test_data"]
    capsys.readouterr()
    assert main(args) == 0  # unchanged data: read back
    assert "read (same checkpoint bytes, data content and options)" in capsys.readouterr().err
    _rewrite_test_images(mine, seed=3)
    assert main(args) == 0
    assert "read (same" not in capsys.readouterr().err  # evaluated anew, both of them
    after = EvalDir(out / first).load().info
    assert after["test_data"] != before and after["test_data"]["size"] == 20
    fresh = tmp_path / "fresh"
    assert main(["eval", str(checkpoint), "--data", str(mine), "--out", str(fresh), *EVAL]) == 0
    assert EvalDir(out / first).load().values("knn k=3") == [_knn(fresh)]


# ----------------------------------------------------------------------------- item 3
@pytest.mark.slow  # a 1-trial search (two tiny training runs)
def test_a_search_over_images_that_changed_is_refused(base, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    mine = tmp_path / "d.npz"
    mine.write_bytes(data.read_bytes())
    config = tmp_path / "mine.yaml"
    config.write_text("base: fmnist-vicreg-e2mc\n")
    sets = [a for item in [*TINY_RUN, "training.max_steps=2", "monitor.probe_epochs=2",
                           "monitor.knn_k=3"] for a in ("--set", item)]
    args = ["search", "--config", str(config), "--from", str(checkpoint),
            "--data", str(mine), "--out", str(tmp_path / "s"), "--val-split", "8",
            "--grid", "addon.params.beta=10", "--metric", "val/knn", "--quiet", *sets]
    assert main(args) == 0
    record = json.loads((tmp_path / "s" / "search.json").read_text())
    assert record["spec"]["data_identity"]["size"] == 40
    with np.load(mine) as f:
        arrays = dict(f)
    reordered = {**arrays, "x_train": arrays["x_train"][::-1].copy()}  # the same images
    np.savez(mine, **reordered)
    capsys.readouterr()
    assert main(args) == 2
    _one_error(capsys, "holds a search of other images", "use another --out")
    # the images back; the config file edited: the done runs refuse, and the advice is one
    # the search has (it has no --override-config)
    np.savez(mine, **arrays)
    config.write_text("base: fmnist-vicreg-e2mc\noptim:\n  base_lr: 0.123\n")
    assert main(args) == 2
    line = _one_error(capsys, "optim.base_lr", "another --out")
    assert "--override-config" not in line


# ----------------------------------------------------------------------------- item 4
def _continue(checkpoint: Path, data: Path, run: Path, *sets: str, extra=()) -> int:
    args = [a for item in [*TINY_RUN, *sets] for a in ("--set", item)]
    return main(["continue", "--config", "fmnist-vicreg-continued", "--from", str(checkpoint),
                 "--data", str(data), "--out", str(run), *args, *extra])


def _checkpoint(run: Path) -> dict:
    return torch.load(RunDir(run).checkpoint, weights_only=True)


@pytest.mark.parametrize("change", ["fewer", "more", "replaced"])
def test_a_run_resumed_over_other_images_is_refused_or_goes_on_as_recorded(
        base, tmp_path: Path, capsys: pytest.CaptureFixture, change: str) -> None:
    checkpoint, data = base
    mine, run = tmp_path / "d.npz", tmp_path / "run"
    mine.write_bytes(data.read_bytes())
    # 5 steps an epoch (40 images, batch 8); stopped at step 7 (epoch 1, batch 2)
    assert _continue(checkpoint, mine, run, "training.epochs=2", "training.max_steps=7") == 0
    assert _checkpoint(run)["data"] == data_identity(load_and_train_images(mine))
    with np.load(mine) as f:
        arrays = dict(f)
    n = {"fewer": 32, "more": 48, "replaced": 40}[change]
    rng = np.random.default_rng(1)
    arrays["x_train"] = rng.integers(0, 256, (n, 16, 16), dtype=np.uint8)
    arrays["y_train"] = np.arange(n) % 4
    np.savez(mine, **arrays)
    capsys.readouterr()
    assert _continue(checkpoint, mine, run, "training.epochs=2") == 2
    _one_error(capsys, "the training images changed since its checkpoint at step 7",
               "--override-config")
    assert _checkpoint(run)["step"] == 7  # nothing trained, nothing written
    # told to: the change is recorded and the epoch goes on where it was, on these images
    assert _continue(checkpoint, mine, run, "training.epochs=2",
                     extra=["--override-config"]) == 0
    err = capsys.readouterr().err
    assert "data change on resume" in err
    changes = read_jsonl(RunDir(run).config_changes)
    assert changes[-1]["step"] == 8 and "data" in changes[-1]["changes"]
    assert changes[-1]["changes"]["data"]["new"]["size"] == n
    steps_per_epoch = n // 8
    final = _checkpoint(run)
    assert final["run_epoch"] == 2 and final["batch_in_epoch"] == 0
    # epoch 0 had 5 steps; epoch 1 went on from batch 2 to its new end
    assert final["step"] == 5 + max(steps_per_epoch, 2) - 2 + 2
    steps = [r["step"] for r in RunDir(run).read_metrics() if "loss" in r]
    assert steps == list(range(1, final["step"] + 1))  # every step once, none skipped


def load_and_train_images(path: Path):
    from e2mc.training.build import training_images

    return training_images(load_config("fmnist-vicreg-continued",
                                       [*TINY_RUN, f"data.dataset={path}"]))[0]


# ----------------------------------------------------------------------------- item 5
def test_the_missing_value_marker_is_an_error_naming_the_key(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture
                                                             ) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("base: fmnist-vicreg-e2mc\ndata:\n  dataset: ???\n")
    assert main(["config", "show", str(config)]) == 2
    _one_error(capsys, "'data.dataset' is ???")
    assert load_config(str(config), ["data.dataset=builtin"]).data.dataset == "builtin"


# ----------------------------------------------------------------------------- item 6
def test_a_planted_lock_link_is_refused_and_its_target_unchanged(
        base, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    for command in (["eval", str(checkpoint), "--data", str(data), "--out",
                     str(tmp_path / "e"), *EVAL],
                    ["continue", "--config", "fmnist-vicreg-continued", "--from",
                     str(checkpoint), "--data", str(data), "--out", str(tmp_path / "r"),
                     *[a for item in TINY_RUN for a in ("--set", item)]]):
        out = Path(command[command.index("--out") + 1])
        out.mkdir()
        (out / LOCK).symlink_to(precious)
        capsys.readouterr()
        assert main(command) == 2
        _one_error(capsys, ".e2mc.lock is a symbolic link")
        assert precious.read_text() == "mine"


# ----------------------------------------------------------------------------- item 7
def test_eval_deletes_only_its_own_files(base, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    out = tmp_path / "e"
    (out / "predictions").mkdir(parents=True)
    notes = out / "predictions" / "notes.txt"
    notes.write_text("a user's file")
    lookalike = out / "predictions" / "knn_k3.0123456789ab.npz"  # not one it wrote
    lookalike.write_bytes(b"mine")
    for _ in range(2):  # a fresh evaluation, then one that replaces it
        assert main(["eval", str(checkpoint), "--data", str(data), "--out", str(out),
                     *EVAL]) == 0
    assert notes.read_text() == "a user's file" and lookalike.read_bytes() == b"mine"
    referenced = {e.predictions for e in EvalDir(out).load().entries}
    assert {f"predictions/{p.name}" for p in (out / "predictions").iterdir()} == {
        *referenced, "predictions/notes.txt", "predictions/knn_k3.0123456789ab.npz"}
    # a linked predictions folder: refused, nothing behind it touched
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.npz").write_bytes(b"x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "predictions").symlink_to(elsewhere)
    capsys.readouterr()
    assert main(["eval", str(checkpoint), "--data", str(data), "--out", str(linked),
                 *EVAL]) == 2
    _one_error(capsys, "predictions is a symbolic link")
    assert [p.name for p in elsewhere.iterdir()] == ["data.npz"]


# ----------------------------------------------------------------------------- item 8
def test_names_cannot_become_paths_outside_the_output(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "deep" / "er" / "analysis"
    assert main(["analyze", "builtin:demo-vicreg", "builtin:demo-vicreg", "--data", "builtin",
                 "--names", "a,x/../../../precious", "--out", str(out), "--num-samples", "64",
                 "-q"]) == 2
    _one_error(capsys, "cannot be a file name")
    assert not list(tmp_path.rglob("precious*"))


# ----------------------------------------------------------------------------- item 9
def _image_folder(root: Path, n: int = 24) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / "train" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(
            folder / f"{i:02d}.png")
    return root


def test_an_unreadable_image_mid_epoch_checkpoints_first_and_skip_corrupt_resumes(
        base, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from e2mc.training.sampling import EpochBatchSampler

    checkpoint, _ = base
    folder = _image_folder(tmp_path / "images")
    run = tmp_path / "run"
    # 3 steps an epoch; the unreadable image is drawn in the 2nd batch of the 1st epoch, so
    # a step is done when the loader meets it (the run checkpoints only at epoch ends)
    seed = load_config("fmnist-vicreg-continued", TINY_RUN).training.seed
    sampler = EpochBatchSampler(24, 8, seed=seed)
    sampler.set_epoch(0)
    index = list(sampler)[1][0][0]
    bad = sorted((folder / "train").rglob("*.png"), key=lambda p: (p.parent.name, p.name))[index]
    bad.write_bytes(bad.read_bytes()[:40])
    assert _continue(checkpoint, folder, run, "training.epochs=2") == 2
    line = _one_error(capsys, f"cannot read image file {bad}", "--skip-corrupt",
                      "checkpoint written at step 1")
    assert _checkpoint(run)["step"] == 1 and _checkpoint(run)["batch_in_epoch"] == 1
    # the flag the message names may be turned on when resuming; the change is recorded
    assert _continue(checkpoint, folder, run, "training.epochs=2",
                     extra=["--skip-corrupt"]) == 0
    assert "data change on resume" in capsys.readouterr().err and line
    changes = {k: v for c in read_jsonl(RunDir(run).config_changes) if c["step"] == 2
               for k, v in c["changes"].items()}
    assert changes["data.skip_corrupt"] == {"old": False, "new": True}
    assert changes["data"]["new"]["size"] == 23 and changes["data"]["old"]["size"] == 24
    final = _checkpoint(run)
    # 23 images: 2 steps an epoch; epoch 0 goes on from its batch 1, then epoch 1
    assert final["run_epoch"] == 2 and final["data"]["size"] == 23 and final["step"] == 4
    steps = [r["step"] for r in RunDir(run).read_metrics() if "loss" in r]
    assert steps == [1, 2, 3, 4]


# ----------------------------------------------------------------------------- item 12
def test_a_full_disk_while_a_checkpoint_is_written_is_one_line(
        base, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import e2mc.files as files

    checkpoint, data = base
    real = os.fdopen

    class Full:
        def __init__(self, f) -> None:
            self.f = f

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(files.os, "fdopen",
                        lambda fd, mode, **kw: Full(real(fd, mode, **kw)) if "b" in mode
                        else real(fd, mode, **kw))
    assert _continue(checkpoint, data, tmp_path / "run", "training.max_steps=1",
                     "training.keep_epoch_checkpoints=false") == 1
    line = _one_error(capsys, "no space left on the device while writing")
    assert "inline_container" not in line and "checkpoint.pt" in line


def test_confirm_seeds_are_checked_before_the_first_trial(base, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    checkpoint, data = base
    assert main(["search", "--config", "fmnist-vicreg-e2mc", "--from",
                 str(checkpoint), "--data", str(data), "--out", str(tmp_path / "s"),
                 "--grid", "addon.params.beta=10", "--confirm", "-1"]) == 2
    _one_error(capsys, "--confirm seeds must be a list of distinct training seeds")
    assert not (tmp_path / "s").exists()


def test_one_checkpoint_named_three_ways_is_refused(base, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint, data = base
    monkeypatch.chdir(checkpoint.parent)
    (tmp_path / "link.pt").symlink_to(checkpoint)
    assert main(["eval", "./base.pt", "base.pt", str(tmp_path / "link.pt"), "--data",
                 str(data), "--out", str(tmp_path / "o"), *EVAL]) == 2
    _one_error(capsys, "are the same file")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- planted links
def _plant(root: Path, rel: Path, is_dir: bool, victim: Path) -> Path:
    """A symbolic link at ``root/rel`` to a file or folder of ``victim`` holding "precious"."""
    target = victim / f"{len(list(victim.iterdir()))}"
    if is_dir:
        target.mkdir()
        (target / "precious").write_text("precious")
    else:
        target.write_text("precious")
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).symlink_to(target, target_is_directory=is_dir)
    return target


def _victims_unchanged(victim: Path) -> None:
    for p in victim.rglob("*"):
        assert p.is_dir() or p.read_text() == "precious", p
        assert not p.is_dir() or [q.name for q in p.iterdir()] == ["precious"], p


def _paths(root: Path) -> list[tuple[Path, bool]]:
    return sorted((p.relative_to(root), p.is_dir()) for p in root.rglob("*")
                  if ".e2mc.lock" not in p.name and "tensorboard" not in p.parts
                  and "predictions" not in p.parent.parts)


def _planted_everywhere(make: Path, command, tmp_path: Path,
                        capsys: pytest.CaptureFixture, keep=lambda rel: True) -> int:
    """Run ``command(out)`` once for the paths it writes (those ``keep`` keeps), then once per
    path with a link planted there: it succeeds or refuses in one line, and never changes the
    link's target."""
    assert command(make) == 0
    paths = [(rel, is_dir) for rel, is_dir in _paths(make) if keep(rel)]
    victim = tmp_path / "victim"
    victim.mkdir()
    for i, (rel, is_dir) in enumerate(paths):
        out = tmp_path / f"planted{i}"
        _plant(out, rel, is_dir, victim)
        capsys.readouterr()
        code = command(out)
        err = capsys.readouterr().err
        assert code in (0, 2), (rel, err)
        assert code == 0 or len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err
        _victims_unchanged(victim)
    return len(paths)


@pytest.mark.slow  # a tiny run per path it writes
def test_links_planted_at_every_path_of_a_run_change_no_target(base, tmp_path: Path,
                                                               capsys) -> None:
    checkpoint, data = base
    sets = ["training.keep_epoch_checkpoints=true", "data.val_split=8",
            "monitor.probe_epochs=2", "monitor.knn_k=3", "monitor.keep_best=val/knn",
            "training.max_steps=2"]

    def command(out: Path) -> int:
        return _continue(checkpoint, data, out, *sets)

    planted = _planted_everywhere(tmp_path / "made", command, tmp_path, capsys)
    assert planted >= 9  # config, start, metrics, checkpoints, best, split, monitor, ...


@pytest.mark.slow
def test_links_planted_at_every_path_of_an_evaluation_change_no_target(base, tmp_path: Path,
                                                                       capsys) -> None:
    checkpoint, data = base

    def command(out: Path) -> int:
        return main(["eval", str(checkpoint), "--data", str(data), "--out", str(out), *EVAL])

    assert _planted_everywhere(tmp_path / "made", command, tmp_path, capsys) >= 3


@pytest.mark.slow
def test_links_planted_at_every_path_of_a_search_change_no_target(base, tmp_path: Path,
                                                                  capsys) -> None:
    checkpoint, data = base
    sets = [a for item in [*TINY_RUN, "training.max_steps=1", "monitor.probe_epochs=2",
                           "monitor.knn_k=3"] for a in ("--set", item)]

    def command(out: Path) -> int:
        return main(["search", "--config", "fmnist-vicreg-e2mc", "--from",
                     str(checkpoint), "--data", str(data), "--out", str(out), "--val-split",
                     "8", "--grid", "addon.params.beta=10", "--metric", "val/knn", "--quiet",
                     *sets])

    # the search's own files and folders, down to each run directory (whose files the run
    # test covers)
    planted = _planted_everywhere(
        tmp_path / "made", command, tmp_path, capsys,
        keep=lambda rel: len(rel.parts) == 1 or rel.name == "run"
        or rel.name.startswith("control-"))
    assert planted >= 6
