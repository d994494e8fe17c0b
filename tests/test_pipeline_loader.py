"""The fast view pipeline in a DataLoader: batches collated in place (the views of the item
path, through workers' shared memory, under each sample's seeding), crops resized as the
strided crop would be, corrupt files mid-epoch, and training through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch.utils.data import DataLoader

from e2mc.data import SafeImageFolder, ViewBatch, build_views, collate_views, photometric_cv2
from e2mc.data.fast_views import DeviceAugment, FastViewDataset, FastViews
from e2mc.data.views import draw_view_params
from e2mc.errors import CorruptImageError
from e2mc.training.sampling import EpochBatchSampler, SeededSamples
from synthetic_photos import write_jpeg_folder

BACKENDS = ["torch"] + (["opencv"] if photometric_cv2.available() else [])


# ----------------------------------------------------------------------------- crops
@pytest.mark.parametrize("recipe", ["vicreg", "swav"])  # bilinear and bicubic, 2 sizes
def test_crops_are_the_strided_crops_resized(tmp_path: Path, recipe: str) -> None:
    """Each crop is resized from a contiguous channels-last copy (torch's vectorised uint8
    path): bit-identical to resizing the strided crop of the decoded image."""
    path = write_jpeg_folder(tmp_path / "jpegs", 1, (200, 150), 90)[0]
    fast = FastViews(build_views(recipe, 64), draft=False)
    for seed in range(4):
        torch.manual_seed(seed)
        crops, params = fast._crops(path)
        torch.manual_seed(seed)
        again = [draw_view_params(s, 200, 150) for s in fast.specs]
        image = fast._decode(path.read_bytes(), Image.open(path), 1)
        for crop, p, q, spec in zip(crops, params, again, fast.specs, strict=True):
            assert torch.equal(p, q)
            top, left, h, w = (round(float(v)) for v in p[:4])
            want = TF.resize(image[:, top:top + h, left:left + w], [spec.size, spec.size],
                             interpolation=spec.interpolation, antialias=True)
            assert torch.equal(crop, want)


# ----------------------------------------------------------------------------- batches
def _views_one_by_one(ds: SeededSamples, keys: list[tuple[int, int]]) -> tuple:
    return collate_views([ds[key] for key in keys])


def _assert_gray_levels_of(batch_views: list[torch.Tensor], ref_views: list[torch.Tensor],
                           fast: FastViews) -> None:
    """The 8-bit views, normalised on the 'device', are the item path's float views (which
    are 8-bit images normalised too)."""
    finished = DeviceAugment(fast, photometric=False)(batch_views)
    for got8, got, ref, spec in zip(batch_views, finished, ref_views, fast.specs, strict=True):
        assert got8.dtype == torch.uint8 and got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        levels = ref * torch.tensor(spec.std).view(1, -1, 1, 1) + torch.tensor(spec.mean).view(
            1, -1, 1, 1)
        torch.testing.assert_close(levels * 255, got8.float(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", ["vicreg", "swav"])
def test_a_batch_collated_in_place_is_the_items_views(tmp_path: Path, recipe: str,
                                                      backend: str) -> None:
    write_jpeg_folder(tmp_path / "imgs", 6, (90, 70), classes=2)
    fast = FastViews(build_views(recipe, 32), backend=backend)
    ds = SeededSamples(FastViewDataset(SafeImageFolder(tmp_path / "imgs"), fast))
    keys = [(4, 11), (0, 7), (5, 7), (2, 123456789)]
    state = torch.get_rng_state()
    batch = ds.__getitems__(keys)
    assert isinstance(batch, ViewBatch)
    assert torch.equal(torch.get_rng_state(), state), "the caller's generator is untouched"
    views, labels = collate_views(batch)
    ref_views, ref_labels = _views_one_by_one(ds, keys)
    assert len(views) == len(fast.specs) and torch.equal(labels, ref_labels)
    _assert_gray_levels_of(views, ref_views, fast)
    assert not torch.equal(views[0][1], views[0][2]), "another seed, other views"
    again, _ = collate_views(ds.__getitems__(keys))
    assert all(torch.equal(a, b) for a, b in zip(again, views, strict=True)), "reproducible"


def test_views_normalised_into_given_tensors_equal_new_ones() -> None:
    # the trainer on a CPU normalises each batch into the previous batch's tensors
    fast = FastViews(build_views("swav", 32))
    finish = DeviceAugment(fast, photometric=False)
    levels = [torch.randint(0, 256, (4, 3, s.size, s.size), dtype=torch.uint8)
              for s in fast.specs]
    fresh = finish(levels)
    out = [torch.full_like(v, float("nan")).contiguous(memory_format=torch.channels_last)
           for v in fresh]
    again = finish(levels, out=out)
    assert all(a is o for a, o in zip(again, out, strict=True)), "written into out"
    assert all(torch.equal(a, b) for a, b in zip(again, fresh, strict=True))
    smaller = [v[:3] for v in levels]  # a last, smaller batch: new tensors, not out
    last = finish(smaller, out=out)
    assert all(a is not o and a.shape[0] == 3 for a, o in zip(last, out, strict=True))
    assert all(torch.equal(a, b[:3]) for a, b in zip(last, fresh, strict=True))


def test_a_loader_of_collated_batches_gives_the_items_views(tmp_path: Path) -> None:
    # through a worker: the batch is allocated in shared memory and handed over as it is
    write_jpeg_folder(tmp_path / "imgs", 8, (90, 70), classes=2)
    fast = FastViews(build_views("vicreg", 32))
    ds = SeededSamples(FastViewDataset(SafeImageFolder(tmp_path / "imgs"), fast))
    sampler = EpochBatchSampler(8, 4, seed=3)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=1, collate_fn=collate_views,
                        timeout=120)
    batches = list(loader)
    assert len(batches) == 2
    for (views, labels), keys in zip(batches, sampler, strict=True):
        in_process, _ = collate_views(ds.__getitems__(keys))
        assert all(torch.equal(a, b) for a, b in zip(views, in_process, strict=True))
        ref_views, ref_labels = _views_one_by_one(ds, keys)
        assert torch.equal(labels, ref_labels)
        _assert_gray_levels_of(views, ref_views, fast)


def test_device_mode_items_are_not_collated_in_place(tmp_path: Path) -> None:
    write_jpeg_folder(tmp_path / "imgs", 2, (90, 70), classes=2)
    ds = FastViewDataset(SafeImageFolder(tmp_path / "imgs"),
                         FastViews(build_views("vicreg", 32), mode="device"))
    assert not ds.collates
    with pytest.raises(ValueError, match="collated\\(\\) is for mode='cpu'"):
        ds.collated([0])
    items = SeededSamples(ds).__getitems__([(0, 1), (1, 2)])
    assert isinstance(items, list) and len(items) == 2  # the device collate takes items


# ----------------------------------------------------------------------------- corrupt files
def _folder_with_truncated_jpeg(root: Path) -> Path:
    paths = write_jpeg_folder(root, 12, (64, 48), classes=2)
    bad = paths[6]
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return bad


@pytest.mark.slow  # integration: a few seconds on 2 cores
def test_truncated_jpeg_mid_epoch_names_the_file_with_workers(tmp_path: Path) -> None:
    bad = _folder_with_truncated_jpeg(tmp_path / "imgs")
    ds = FastViewDataset(SafeImageFolder(tmp_path / "imgs"), FastViews(build_views("vicreg", 32)))
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_views, timeout=120)
    with pytest.raises(CorruptImageError, match=bad.name):
        for _ in loader:
            pass
    with pytest.raises(CorruptImageError, match="cannot read image file .*" + bad.name):
        ds[[p for p, _ in ds.samples].index(str(bad))]
    # the training loader's path: whole batches written in place, under each sample's seeding
    batches = DataLoader(SeededSamples(ds), batch_sampler=EpochBatchSampler(len(ds), 4),
                         num_workers=2, collate_fn=collate_views, timeout=120)
    with pytest.raises(CorruptImageError, match=bad.name):
        for _ in batches:
            pass


def test_skip_corrupt_drops_and_counts_with_workers(tmp_path: Path) -> None:
    bad = _folder_with_truncated_jpeg(tmp_path / "imgs")
    (tmp_path / "imgs" / "class_0" / "empty.jpg").write_bytes(b"")
    with pytest.warns(UserWarning, match="skipped 2 corrupt"):
        folder = SafeImageFolder(tmp_path / "imgs", skip_corrupt=True)
    assert folder.num_skipped == 2 and str(bad) in folder.skipped_files
    ds = FastViewDataset(folder, FastViews(build_views("vicreg", 32)))
    assert len(ds) == 11 and ds.num_skipped == 2
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_views, timeout=120)
    seen = 0
    for views, _ in loader:
        seen += len(views[0])
        flat = views[0].flatten(1)
        assert bool((flat.std(dim=1) > 0.05).all()), "no blank (zero) image"
    assert seen == 11


# ----------------------------------------------------------------------------- through the CLI
def test_pretrain_with_the_fast_pipeline(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from e2mc.artifacts import RunDir
    from e2mc.cli import main

    write_jpeg_folder(tmp_path / "data" / "train", 16, (80, 60), classes=2)
    common = ["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", str(tmp_path / "data"),
              "--epochs", "1", "--set", "model.backbone=mobilenet_v3_small",
              "--set", "model.small_images=false", "--set", "model.in_channels=3",
              "--set", "data.channels=3", "--set", "data.image_size=32",
              "--set", "training.batch_size=8", "--set", "training.log_every=1",
              "--set", "training.progress=false", "--set", "training.device=cpu",
              "--set", "training.keep_epoch_checkpoints=false",
              "--set", "method.params={projector: 32-32}"]
    assert main([*common, "--out", str(tmp_path / "run"), "--set", "data.pipeline=fast"]) == 0
    fast = RunDir(tmp_path / "run").read_metrics()
    assert [m["step"] for m in fast] == [1, 2]
    # photometric steps in the trainer (batched torch) instead of the workers: the same draws,
    # so the same views up to float rounding, and the same losses
    assert main([*common, "--out", str(tmp_path / "dev"), "--set", "data.pipeline=device",
                 "--set", "data.num_workers=2"]) == 0
    dev = RunDir(tmp_path / "dev").read_metrics()
    assert [m["step"] for m in dev] == [1, 2]
    for a, b in zip(fast, dev, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3)
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "bad"), "--set", "data.pipeline=dali"]) == 2
    assert "data.pipeline must be one of 'auto', 'pil', 'fast', 'device'" in capsys.readouterr().err
    assert main(["pretrain", "--config", "fmnist-vicreg-pretrain", "--data", "builtin",
                 "--out", str(tmp_path / "npz"), "--set", "data.pipeline=fast",
                 "--set", "training.device=cpu"]) == 2
    assert "not an image folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------- subsets
@pytest.mark.parametrize("pipeline", ["auto", "pil", "fast", "device"])
def test_a_limit_and_a_validation_split_work_with_every_pipeline(tmp_path: Path,
                                                                pipeline: str) -> None:
    """Issue 48: ``data.limit`` and a validation split are one subset (a subset of a subset is
    folded into one) that every pipeline sees through to the image files (``auto`` on a CPU is
    the fast pipeline, which refused the limit's subset): the training set is the limit's first
    images less the held-out ones, each with its own file and label."""
    from types import SimpleNamespace

    from e2mc.config import load_config
    from e2mc.training.build import build_train_dataset, holdout, training_images
    from e2mc.training.hardware import hardware_choices, is_image_folder

    write_jpeg_folder(tmp_path / "data" / "train", 12, (48, 40), classes=3)
    cfg = load_config("fmnist-vicreg-pretrain", [
        f"data.dataset={tmp_path / 'data'}", f"data.pipeline={pipeline}", "data.limit=9",
        "data.val_split=3", "data.channels=3", "data.image_size=16", "training.batch_size=2"])
    images = training_images(cfg)
    assert is_image_folder(images[0])  # auto's choice sees through the limit to the files
    chosen = hardware_choices(cfg, torch.device("cpu"), True).get("data.pipeline")
    if pipeline == "auto":
        assert chosen.value == "fast"
    runs_with = chosen.value if pipeline == "auto" else pipeline
    split = holdout(cfg, images[0])
    assert sorted(split["train"] + split["val"]) == list(range(9)) and len(split["val"]) == 3
    dataset = build_train_dataset(cfg, SimpleNamespace(view_recipe="vicreg"), split, images,
                                  pipeline=runs_with)
    kept = [SafeImageFolder(tmp_path / "data" / "train").samples[i] for i in split["train"]]
    assert len(dataset) == 6
    assert [dataset[i][1] for i in range(6)] == [label for _, label in kept]
    if pipeline != "pil":
        assert [path for path, _ in dataset.samples] == [path for path, _ in kept]
        assert list(dataset.labels) == [label for _, label in kept]
