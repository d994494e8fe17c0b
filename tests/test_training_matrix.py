"""Every training path through every callback (issue 40): each of the 8 methods, through each
input pipeline (``pil``, ``fast``, ``device``), without and with the E2MC add-on, trained by the
CLI on a tiny image folder for long enough that every periodic callback acts at least twice:

- the validation monitor (``val/knn`` records at steps 0, 2, 4 and 6),
- keep-best (``best.pt`` and its record of the best step),
- the collapse monitor (``collapse/effective_rank`` at the ends of epochs 2 and 3),
- the epoch copies (``checkpoints/epoch_0000.pt`` .. ``epoch_0003.pt``) and the step checkpoints,
- the progress bar (a line per epoch on stderr).

A run is 6 steps of batch 4 on 28 px images (about a second on a CPU). The device pipeline's
views went through the collapse monitor's own reading of the data set before, which took the
device pipeline's uint8 crops for views and crashed at the first check.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from e2mc.artifacts import RunDir

METHODS = ["vicreg", "swav", "simsiam", "barlowtwins", "simclr", "byol", "mocov3", "dino"]
PIPELINES = ["pil", "fast", "device"]
ADDONS = ["none", "e2mc"]
EPOCHS, STEPS_PER_EPOCH = 3, 2


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 JPEGs of 2 classes: 8 held out for the monitor, 8 for training (2 batches of 4)."""
    from synthetic_photos import write_jpeg_folder

    root = tmp_path_factory.mktemp("matrix") / "data"
    write_jpeg_folder(root / "train", 16, (36, 32), classes=2)
    return root


def train(images: Path, run: Path, method: str, pipeline: str, addon: str,
          capsys: pytest.CaptureFixture[str], device: str = "cpu",
          extra: tuple[str, ...] = ()) -> str:
    """Train one cell through the CLI (``extra``: more ``--set`` overrides); returns its
    stderr."""
    from e2mc.cli import main

    sets = ["training.batch_size=4", "training.log_every=1", "training.progress=true",
            f"training.device={device}", "training.checkpoint_every_steps=2",
            "training.keep_epoch_checkpoints=true", f"data.pipeline={pipeline}",
            "data.num_workers=0", "data.val_split=8", "monitor.every=2",
            "monitor.keep_best=val/knn", "monitor.knn_k=1", "monitor.fractions=[1.0]",
            "monitor.label_seeds=[0]", "monitor.probe_epochs=1", "monitor.batch_size=8",
            f"addon.name={addon}", *extra]
    argv = ["pretrain", "--config", f"fmnist-{method}-pretrain", "--data", str(images),
            "--out", str(run), "--epochs", str(EPOCHS)]
    code = main(argv + [a for s in sets for a in ("--set", s)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    return err


def _cells() -> list:
    """All 48 cells; the fast loop (``-m "not slow"``) runs 16 of them: every method through the
    device pipeline with E2MC and through ``pil`` or ``fast`` without it, so that every method,
    pipeline and add-on is in it. CI runs all."""
    cells = []
    for i, method in enumerate(METHODS):
        fast_loop = {("device", "e2mc"), (PIPELINES[i % 2], "none")}
        for pipeline in PIPELINES:
            for addon in ADDONS:
                marks = [] if (pipeline, addon) in fast_loop else [pytest.mark.slow]
                cells.append(pytest.param(method, pipeline, addon, marks=marks,
                                          id=f"{method}-{pipeline}-{addon}"))
    return cells


@pytest.mark.parametrize("method,pipeline,addon", _cells())
def test_every_method_pipeline_and_addon_through_every_callback(
        images: Path, tmp_path: Path, method: str, pipeline: str, addon: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    err = train(images, run, method, pipeline, addon, capsys)
    assert_every_callback_acted(run, err, addon)


def assert_every_callback_acted(run: Path, err: str, addon: str) -> None:
    """What a cell's run wrote and printed: every step once with finite losses, the add-on's
    terms, and every periodic callback at least twice (the module's docstring)."""
    records = RunDir(run).read_metrics()
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    if addon == "e2mc":
        assert all(r["addon/loss"] != 0 and math.isfinite(r["addon/entropy"])
                   for r in records if "loss" in r)
    else:
        assert all(r["addon/loss"] == 0 for r in records if "loss" in r)
    # the validation monitor at step 0 and every 2 steps
    assert [r["step"] for r in records if "val/knn" in r] == [0, 2, 4, 6]
    # keep-best: the weights of the step it names, one of the monitored ones
    said = re.search(r"keep-best: (?:step (\d+) \(epoch \d+\) has the best val/knn|no step "
                     r"beat the starting model on val/knn)", err)
    assert said is not None, err[-2000:]
    kept = torch.load(run / "best.pt", map_location="cpu", weights_only=False)
    assert kept["step"] == int(said.group(1) or 0) and kept["step"] in (0, 2, 4, 6)
    # the collapse monitor measured the effective rank after the first epoch's warm-up, twice
    ranks = [r for r in records if "collapse/effective_rank" in r]
    assert [r["step"] for r in ranks] == [4, 6]
    assert all(r["collapse/effective_rank"] >= 1.0 for r in ranks)
    # epoch copies at the start and after every epoch; the checkpoint at the end
    copies = sorted(p.name for p in (run / "checkpoints").glob("epoch_*.pt"))
    assert copies == [f"epoch_{e:04d}.pt" for e in range(EPOCHS + 1)]
    assert (run / "checkpoint.pt").is_file()
    # the progress bar: every epoch on stderr
    for epoch in range(1, EPOCHS + 1):
        assert f"epoch {epoch}/{EPOCHS}" in err
