"""One data identity, of content alone (issue 41): the same bytes are the same data under any
spelling of the path, through links and after a change of times alone; other bytes or labels
are other data. The file hashes behind it are read once (a stat-keyed table that is only a
cache). Through the CLI: a resume with another spelling of --data goes on, and an evaluation
of the same images named otherwise is reused and compared."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from e2mc.data import build_dataset
from e2mc.data.identity import data_identity, describe_change, same_data


def _folder(root: Path, n: int = 12, size: int = 16) -> Path:
    """``n`` training and 6 test PNGs in 3 classes."""
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("test", 6)):
        for i in range(count):
            d = root / split / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (size, size), dtype=np.uint8)
            Image.fromarray(pixels).save(d / f"{i}.png")
    return root


def _identity(spec: str | Path) -> dict:
    return data_identity(build_dataset(str(spec), "train"))


def test_the_same_bytes_under_any_name_are_the_same_data(tmp_path: Path, monkeypatch) -> None:
    root = _folder(tmp_path / "imgs")
    reference = _identity(root)
    monkeypatch.chdir(tmp_path)
    os.symlink(root, tmp_path / "linked")
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)  # new inodes, new times, the same bytes
    for spec in ("imgs", "./imgs/", str(root), "linked", "copy"):
        assert _identity(spec) == reference, spec
    for path in root.rglob("*.png"):  # touch: other times alone
        os.utime(path, ns=(1, 10**18))
    assert _identity(root) == reference


def test_other_bytes_or_labels_are_other_data(tmp_path: Path) -> None:
    root = _folder(tmp_path / "imgs")
    reference = _identity(root)
    victim = root / "train" / "c1" / "4.png"
    stamp = victim.stat()
    pixels = np.asarray(Image.open(victim)).copy()
    pixels[0, 0] ^= 1  # one gray level of one pixel; the same size, mtime set back (cp -p)
    Image.fromarray(pixels).save(victim)
    os.utime(victim, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    changed = _identity(root)
    assert not same_data(reference, changed)
    assert "the images differ" in describe_change(reference, changed)
    moved = _folder(tmp_path / "moved")  # the same files, one in another class
    (moved / "train" / "c0" / "0.png").rename(moved / "train" / "c1" / "0.png")
    assert not same_data(reference, _identity(moved))


def test_each_file_is_read_once_and_the_table_is_only_a_cache(tmp_path: Path,
                                                             monkeypatch, capsys) -> None:
    from e2mc.data import file_hashes

    root = _folder(tmp_path / "imgs")
    monkeypatch.setenv("E2MC_HASH_CACHE", str(tmp_path / "hashes.sqlite3"))
    read: list[str] = []
    real = file_hashes.sha256_file
    monkeypatch.setattr(file_hashes, "sha256_file", lambda p: read.append(p) or real(p))
    reference = _identity(root)
    assert len(read) == 12
    assert _identity(root) == reference and len(read) == 12  # nothing read again
    os.utime(root / "train" / "c0" / "0.png", ns=(1, 10**18))
    assert _identity(root) == reference and len(read) == 13  # that one file again
    # a corrupt table: one warning, every file hashed, the same identity
    (tmp_path / "hashes.sqlite3").write_bytes(b"not a database" * 100)
    assert _identity(root) == reference and len(read) == 25
    assert "warning: the file-hash cache" in capsys.readouterr().err
    # a table that cannot be written: the same identity
    monkeypatch.setenv("E2MC_HASH_CACHE", str(tmp_path / "missing" / "dir" / "h.sqlite3"))
    (tmp_path / "missing").write_text("a file where a folder would be")
    assert _identity(root) == reference


def test_the_table_records_the_bytes_stat_it_read(tmp_path: Path, monkeypatch) -> None:
    from e2mc.data.file_hashes import file_digests
    from e2mc.files import sha256_file

    root = _folder(tmp_path / "imgs", n=3)
    table = tmp_path / "hashes.sqlite3"
    monkeypatch.setenv("E2MC_HASH_CACHE", str(table))
    paths = sorted(str(p) for p in root.rglob("*.png"))
    assert file_digests(paths) == [sha256_file(p) for p in paths]
    with sqlite3.connect(table) as db:
        rows = db.execute("SELECT ino, size, sha256 FROM hashes ORDER BY ino").fetchall()
    expected = sorted((os.stat(p).st_ino, os.stat(p).st_size, sha256_file(p)) for p in paths)
    assert rows == expected


# ----------------------------------------------------------------------------- through the CLI
TINY = ["--set", "model.backbone=cnn5_small", "--set", "model.in_channels=1",
        "--set", "data.image_size=16", "--set", "data.channels=1",
        "--set", "training.batch_size=4", "--set", "training.log_every=1",
        "--set", "training.progress=false", "--set", "training.device=cpu",
        "--set", "training.keep_epoch_checkpoints=false", "--set", "data.num_workers=0",
        "--set", "method.params={projector: 32-32}"]


@pytest.mark.slow  # two short trainings and two evaluations
def test_a_resume_and_a_compare_over_the_same_images_named_otherwise(tmp_path: Path,
                                                                    monkeypatch, capsys) -> None:
    from e2mc.artifacts import RunDir
    from e2mc.cli import main

    _folder(tmp_path / "d3")
    monkeypatch.chdir(tmp_path)
    args = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--out", "run", "--epochs",
            "2", *TINY]
    assert main([*args, "--data", "d3", "--set", "training.max_steps=2"]) == 0
    for path in Path("d3").rglob("*.png"):
        os.utime(path, ns=(1, 10**18))
    capsys.readouterr()
    assert main([*args, "--data", "./d3/"]) == 0  # another spelling, touched files: goes on
    err = capsys.readouterr().err
    assert "config change on resume: data.dataset: 'd3' -> './d3/'" in err
    assert [r["step"] for r in RunDir("run").read_metrics() if "loss" in r] == [1, 2, 3, 4, 5, 6]
    # two evaluations of the same test images, named otherwise: compared
    os.symlink(tmp_path / "d3", tmp_path / "link")
    common = ["--protocol", "knn", "--knn-k", "3", "--no-cache", "--quiet", "--device", "cpu",
              "--image-size", "16"]
    assert main(["eval", "run", "--data", "d3", "--out", "ev-a", *common]) == 0
    assert main(["eval", "run", "--data", str(tmp_path / "link"), "--out", "ev-b",
                 *common]) == 0
    assert main(["compare", "ev-a", "ev-b", "--names", "a,b", "--out", "cmp"]) == 0
