"""Input-pipeline throughput: images/s per CPU core for each ImageNet view recipe.

Pipelines, all measured in the same run through a DataLoader over the same JPEG folder:

* ``official``: the official scripts' pipeline (VICReg ``augmentations.py``, SwAV
  ``multicropdataset.py``, SimSiam ``main_simsiam.py``): PIL decode, torchvision transforms on
  PIL images, blur with PIL's ``ImageFilter.GaussianBlur``, ``ToTensor`` + ``Normalize``;
  the reference of the ratios.
* ``e2mc-pil``: this package's ``build_views`` on PIL images (torchvision's 23-px ``GaussianBlur``),
  the project's pipeline before the fast one.
* ``e2mc-fast``: ``FastViews`` (``mode="cpu"``) as the trainer reads it: the same recipe, drawn
  identically, decoded with libjpeg-turbo (DCT-scaled when the crops allow), cropped and
  augmented on tensors, each batch's views written in place as 8-bit images
  (``FastViewDataset.collated``), then normalised by the training process (on a CPU, as the
  trainer does it, into the previous batch's tensors: that CPU time is the last column).
* ``e2mc-fast-torch``: ``e2mc-fast`` without OpenCV (``backend="torch"``): the photometric steps
  with the batched torch code of the ``device`` pipeline, in the workers.
* ``e2mc-device``: ``FastViews`` (``mode="device"``): the workers' share when the photometric
  augmentations run on the training device (decode + crop + resize, uint8 crops out).
* ``e2mc-device-cpu``: ``e2mc-device`` on a machine without a GPU: the photometric steps
  (``DeviceAugment``) run batched in the training process on the CPU, counted in the last column.

The CPU time per image is the workers' (decoding, augmenting, collating and handing the batches
over) and, in the last column, also the training process's before the model can use a batch
(``training_process_step``: the normalisation of ``e2mc-fast``'s 8-bit views; nothing for float
views; ``e2mc-device``'s rest runs on the GPU, ``e2mc-device-cpu``'s on this CPU).

Every (recipe, pipeline, workers) cell is measured ``--repeats`` times, interleaved, and the
median is reported: the machine may be shared. Without ``--data`` a folder of natural-looking
JPEGs (500x375, quality 90, ``tests/synthetic_photos.py``) is generated in a temporary directory.

    PYTHONPATH=src python benchmarks/input_pipeline.py --out input_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageFilter
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchvision import transforms as T

from e2mc.data import MultiViewDataset, build_views, collate_views
from e2mc.data.fast_views import DeviceAugment, FastViewDataset, FastViews, collate_device_views
from e2mc.data.image_folder import SafeImageFolder
from run_meta import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_photos import write_jpeg_folder  # noqa: E402  (the tests' photos)

PIPELINES = ("official", "e2mc-pil", "e2mc-fast", "e2mc-fast-torch", "e2mc-device",
             "e2mc-device-cpu")
RECIPES = ("vicreg", "swav", "simsiam")


class PILGaussianBlur:
    """The official VICReg / SimSiam / SwAV (``PILRandomGaussianBlur``) blur: PIL's Gaussian
    filter with radius sigma ~ U(sigma_min, sigma_max)."""

    def __init__(self, sigma: tuple[float, float]) -> None:
        self.sigma = sigma

    def __call__(self, img: Image.Image) -> Image.Image:
        sigma = float(torch.empty(1).uniform_(*self.sigma))
        return img.filter(ImageFilter.GaussianBlur(radius=sigma))


def _pil_blur(t: Any) -> Any:
    if isinstance(t, T.GaussianBlur):
        return PILGaussianBlur(t.sigma)
    if isinstance(t, T.RandomApply):
        return T.RandomApply([_pil_blur(u) for u in t.transforms], p=t.p)
    return t


def official_views(recipe: str, image_size: int) -> Any:
    """``build_views(recipe)`` with the official scripts' PIL blur instead of torchvision's."""
    views = build_views(recipe, image_size, 3)
    views.transforms = [T.Compose([_pil_blur(t) for t in c.transforms]) for c in views.transforms]
    return views


class _Repeat(Dataset):
    """Cycle over ``dataset`` to ``n`` items. Each worker records its process CPU time when it
    starts its second batch in ``warm_cpu_s[worker id]``: its start up and first batch end there."""

    def __init__(self, dataset: Any, n: int, batch: int, warm_cpu_s: Any) -> None:
        self.dataset, self.n, self.batch, self.warm_cpu_s = dataset, n, batch, warm_cpu_s
        self.recorded = False

    def __len__(self) -> int:
        return self.n

    def _record(self, i: int) -> None:
        if not self.recorded and i // self.batch >= len(self.warm_cpu_s):  # a second batch
            self.warm_cpu_s[get_worker_info().id] = time.process_time()
            self.recorded = True

    def __getitem__(self, i: int) -> Any:
        self._record(i)
        return self.dataset[i % len(self.dataset)]

    def __getitems__(self, indices: list[int]) -> Any:
        """A data set that collates its own batches (the fast pipeline) gets them whole, as the
        trainer's sampler hands them over (an older e2mc's has no ``collates``)."""
        if not getattr(self.dataset, "collates", False):
            return [self[i] for i in indices]
        self._record(indices[0])
        return self.dataset.collated([i % len(self.dataset) for i in indices])


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished (joined) child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_dataset(pipeline: str, recipe: str, folder: SafeImageFolder, size: int) -> Any:
    if pipeline == "official":
        return MultiViewDataset(folder, official_views(recipe, size)), collate_views
    if pipeline == "e2mc-pil":
        return MultiViewDataset(folder, build_views(recipe, size, 3)), collate_views
    mode = "device" if pipeline.startswith("e2mc-device") else "cpu"
    backend = "torch" if pipeline == "e2mc-fast-torch" else "auto"
    fast = FastViews(build_views(recipe, size, 3), mode=mode, backend=backend)
    dataset = FastViewDataset(folder, fast)
    return dataset, collate_views if mode == "cpu" else collate_device_views


def training_process_step(pipeline: str, dataset: Any) -> Any:
    """What the training process does to a batch on a CPU before the model can use it: the
    normalisation of ``e2mc-fast``'s 8-bit views, as the trainer does it (into the previous
    batch's tensors); None where the views are float already (``official``, ``e2mc-pil``, an
    older e2mc's ``e2mc-fast``) and for ``e2mc-device``, whose rest is the GPU's
    (``benchmarks/device_augment.py``); ``e2mc-device-cpu``: that rest on this CPU."""
    if pipeline == "e2mc-device-cpu":
        augment = DeviceAugment(dataset.views)
        return lambda batch: augment(batch[0], batch[1])
    if not pipeline.startswith("e2mc-fast") or not getattr(dataset, "collates", False):
        return None
    finish = DeviceAugment(dataset.views, photometric=False)
    previous: list[Any] = []

    def step(batch: Any) -> None:
        previous[:] = finish(batch[0], out=previous or None)
    return step


def measure(dataset: Any, collate: Any, workers: int, images: int, batch: int,
            finish: Any = None) -> tuple[float, float, float]:
    """``(images/s, images per CPU-second of the workers, images per CPU-second of the workers
    and of ``finish``, the training process's step on each batch)`` through a DataLoader with
    ``workers`` processes, both leaving out each worker's start up and first batch. The CPU rates
    divide the images by all the CPU time the workers used for them (decoding, augmenting,
    collating and handing the batches over: ``getrusage`` of the joined workers, less each one's
    CPU time at the start of its second batch), so they do not depend on how many other
    processes share the cores; the last one adds ``finish``'s CPU time in this process."""
    warm = batch * workers
    warm_cpu_s = multiprocessing.Array("d", workers)
    cpu_before = _children_cpu_s()
    loader = DataLoader(_Repeat(dataset, images + warm, batch, warm_cpu_s), batch_size=batch,
                        shuffle=False, num_workers=workers, collate_fn=collate,
                        worker_init_fn=_one_thread)
    it = iter(loader)
    for _ in range(workers):
        next(it)
    start = time.perf_counter()
    done, finish_cpu = 0, 0.0
    for batch_views in it:  # exhausting the iterator joins the workers
        done += len(batch_views[0][0])  # (views, labels) or (crops, params)
        if finish is not None:
            cpu_start = time.process_time()
            finish(batch_views)
            finish_cpu += time.process_time() - cpu_start
    rate = done / (time.perf_counter() - start)
    del it, loader
    cpu = _children_cpu_s() - cpu_before - sum(warm_cpu_s[:])
    return rate, done / max(cpu, 1e-9), done / max(cpu + finish_cpu, 1e-9)


def _one_thread(_: int) -> None:
    torch.set_num_threads(1)


def load_average() -> list[float]:
    try:
        return list(os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="image folder (root/<class>/<image>); default: "
                        "generated JPEGs")
    parser.add_argument("--generate", type=int, default=128, help="JPEGs to generate")
    parser.add_argument("--jpeg-size", default="500x375", help="generated size WxH")
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES))
    parser.add_argument("--cores", type=int, nargs="+", default=None,
                        help="worker counts (default: 1 and all cores)")
    parser.add_argument("--images", type=int, default=192, help="timed images per measurement")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("input_pipeline.json"))
    args = parser.parse_args()
    cores = args.cores or sorted({1, os.cpu_count() or 1})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data
        if root is None:
            w, h = (int(v) for v in args.jpeg_size.split("x"))
            root = Path(tmp) / "jpegs"
            paths = write_jpeg_folder(root, args.generate, (w, h), args.quality)
            kb = statistics.mean(p.stat().st_size for p in paths) / 1000
            print(f"generated {len(paths)} JPEGs {w}x{h} q{args.quality} (mean {kb:.0f} kB)",
                  file=sys.stderr)
        folder = SafeImageFolder(root)
        load_before = load_average()
        runs: dict[str, list[tuple[float, float, float]]] = {}
        for r in range(args.repeats):
            for recipe in args.recipes:
                for n in cores:
                    for pipeline in args.pipelines:
                        ds, collate = make_dataset(pipeline, recipe, folder, args.image_size)
                        run = measure(ds, collate, n, args.images, args.batch,
                                      training_process_step(pipeline, ds))
                        runs.setdefault(f"{recipe}|{pipeline}|{n}", []).append(run)
                        print(f"repeat {r + 1}/{args.repeats} {recipe:8s} {pipeline:12s} "
                              f"{n} core(s): {run[0]:7.1f} img/s, {run[1]:7.1f} img/CPU-s "
                              f"(workers), {run[2]:7.1f} (and the training process)",
                              file=sys.stderr)
        load_after = load_average()
    fields = ("images_per_s", "images_per_cpu_s", "images_per_cpu_s_with_training_process")
    rows = []
    for recipe in args.recipes:
        for n in cores:
            ref_key = f"{recipe}|official|{n}"
            ref = [statistics.median(v) for v in zip(*runs[ref_key], strict=True)] \
                if ref_key in runs else None
            for pipeline in args.pipelines:
                key = f"{recipe}|{pipeline}|{n}"
                medians = [statistics.median(v) for v in zip(*runs[key], strict=True)]
                row: dict[str, Any] = {"recipe": recipe, "pipeline": pipeline, "cores": n,
                                       "images_per_s_per_core": medians[0] / n,
                                       "all_runs": runs[key]}
                for k, field in enumerate(fields):
                    row[field] = medians[k]
                    row[field.replace("images_per", "ratio_vs_official")] = \
                        medians[k] / ref[k] if ref else None
                rows.append(row)
    result = {"rows": rows, "image_size": args.image_size, "jpeg_folder": str(args.data or
              f"generated {args.generate} x {args.jpeg_size} q{args.quality}"),
              "repeats": args.repeats, "images_per_measurement": args.images,
              "batch": args.batch, "load_average_before": load_before,
              "load_average_after": load_after, "cpu_count": os.cpu_count(),
              "machine": platform.platform(), "processor": platform.processor(),
              "torch": torch.__version__, "pillow": Image.__version__, **run_meta()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'recipe':8s} {'pipeline':12s} {'cores':>5s} {'img/s':>8s} {'x off.':>7s} "
          f"{'img/CPU-s workers':>18s} {'x off.':>7s} {'+ training process':>19s} {'x off.':>7s}")
    for row in rows:
        cells = []
        for field, width in zip(fields, (8, 18, 19), strict=True):
            ratio = row[field.replace("images_per", "ratio_vs_official")]
            cells.append(f"{row[field]:{width}.1f} {ratio:7.2f}" if ratio else
                         f"{row[field]:{width}.1f} {'-':>7s}")
        print(f"{row['recipe']:8s} {row['pipeline']:12s} {row['cores']:5d} " + " ".join(cells))
    print(f"load average before {load_before}, after {load_after}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
