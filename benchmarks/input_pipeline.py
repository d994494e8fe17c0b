"""Input-pipeline throughput: images/s per CPU core for each ImageNet view recipe.

Pipelines, all measured in the same run through a DataLoader over the same JPEG folder:

* ``official``: the official scripts' pipeline (VICReg ``augmentations.py``, SwAV
  ``multicropdataset.py``, SimSiam ``main_simsiam.py``): PIL decode, torchvision transforms on
  PIL images, blur with PIL's ``ImageFilter.GaussianBlur``, ``ToTensor`` + ``Normalize``;
  the reference of the ratios.
* ``e2mc-pil``: this package's ``build_views`` on PIL images (torchvision's 23-px ``GaussianBlur``),
  the project's pipeline before the fast one.
* ``e2mc-fast``: ``FastViews`` (``mode="cpu"``) as training on a CPU reads it: the same recipe,
  drawn identically, decoded with libjpeg-turbo (DCT-scaled when the crops allow), cropped and
  augmented on tensors, each batch's normalised float views written in place
  (``FastViewDataset.collated``).
* ``e2mc-fast-8bit``: the same as training on a GPU reads it: the batch's views as 8-bit images
  (a quarter of the bytes to hand over and to copy to the GPU), which the GPU normalises (not
  counted here, as for ``e2mc-device``).
* ``e2mc-device``: ``FastViews`` (``mode="device"``): the workers' share when the photometric
  augmentations run on the training device (decode + crop + resize, uint8 crops out).

Every (recipe, pipeline, workers) cell is measured ``--repeats`` times, interleaved, and the
median is reported: the machine may be shared. Without ``--data`` a folder of natural-looking
JPEGs (500x375, quality 90, ``e2mc.data.synthetic``) is generated in a temporary directory.

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
from e2mc.data.fast_views import FastViewDataset, FastViews, collate_device_views
from e2mc.data.image_folder import SafeImageFolder
from e2mc.data.synthetic import write_jpeg_folder
from run_meta import run_meta

PIPELINES = ("official", "e2mc-pil", "e2mc-fast", "e2mc-fast-8bit", "e2mc-device")
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
    mode = "device" if pipeline == "e2mc-device" else "cpu"
    dataset = FastViewDataset(folder, FastViews.from_recipe(recipe, size, 3, mode=mode))
    dataset.levels = pipeline == "e2mc-fast-8bit"  # as the trainer sets it for its device
    return dataset, collate_views if mode == "cpu" else collate_device_views


def measure(dataset: Any, collate: Any, workers: int, images: int, batch: int
            ) -> tuple[float, float]:
    """``(images/s, images per CPU-second)`` through a DataLoader with ``workers`` processes,
    both leaving out each worker's start up and first batch. The CPU rate divides the images by
    all the CPU time the workers used for them (decoding, augmenting, collating and handing the
    batches over: ``getrusage`` of the joined workers, less each one's CPU time at the start of
    its second batch), so it does not depend on how many other processes share the cores."""
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
    done = 0
    for batch_views in it:  # exhausting the iterator joins the workers
        done += len(batch_views[0][0])  # (views, labels) or (crops, params)
    rate = done / (time.perf_counter() - start)
    del it, loader
    cpu = _children_cpu_s() - cpu_before - sum(warm_cpu_s[:])
    return rate, done / max(cpu, 1e-9)


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
        rates: dict[str, list[float]] = {}
        cpu_rates: dict[str, list[float]] = {}
        for r in range(args.repeats):
            for recipe in args.recipes:
                for n in cores:
                    for pipeline in args.pipelines:
                        ds, collate = make_dataset(pipeline, recipe, folder, args.image_size)
                        rate, cpu_rate = measure(ds, collate, n, args.images, args.batch)
                        rates.setdefault(f"{recipe}|{pipeline}|{n}", []).append(rate)
                        cpu_rates.setdefault(f"{recipe}|{pipeline}|{n}", []).append(cpu_rate)
                        print(f"repeat {r + 1}/{args.repeats} {recipe:8s} {pipeline:12s} "
                              f"{n} core(s): {rate:7.1f} img/s, {cpu_rate:7.1f} img/CPU-s",
                              file=sys.stderr)
        load_after = load_average()
    rows = []
    for recipe in args.recipes:
        for n in cores:
            has_ref = "official" in args.pipelines
            ref = statistics.median(rates[f"{recipe}|official|{n}"]) if has_ref else None
            cpu_ref = statistics.median(cpu_rates[f"{recipe}|official|{n}"]) if has_ref else None
            for pipeline in args.pipelines:
                key = f"{recipe}|{pipeline}|{n}"
                med, cpu_med = statistics.median(rates[key]), statistics.median(cpu_rates[key])
                rows.append({"recipe": recipe, "pipeline": pipeline, "cores": n,
                             "images_per_s": med, "images_per_s_per_core": med / n,
                             "images_per_cpu_s": cpu_med, "all_runs": rates[key],
                             "all_runs_per_cpu_s": cpu_rates[key],
                             "ratio_vs_official": med / ref if ref else None,
                             "cpu_ratio_vs_official": cpu_med / cpu_ref if cpu_ref else None})
    result = {"rows": rows, "image_size": args.image_size, "jpeg_folder": str(args.data or
              f"generated {args.generate} x {args.jpeg_size} q{args.quality}"),
              "repeats": args.repeats, "images_per_measurement": args.images,
              "batch": args.batch, "load_average_before": load_before,
              "load_average_after": load_after, "cpu_count": os.cpu_count(),
              "machine": platform.platform(), "processor": platform.processor(),
              "torch": torch.__version__, "pillow": Image.__version__, **run_meta()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'recipe':8s} {'pipeline':12s} {'cores':>5s} {'img/s':>8s} {'img/s/core':>10s} "
          f"{'x official':>10s} {'img/CPU-s':>10s} {'x official':>10s}")
    for row in rows:
        ratio = f"{row['ratio_vs_official']:.2f}" if row["ratio_vs_official"] else "-"
        cpu_ratio = f"{row['cpu_ratio_vs_official']:.2f}" if row["cpu_ratio_vs_official"] \
            else "-"
        print(f"{row['recipe']:8s} {row['pipeline']:12s} {row['cores']:5d} "
              f"{row['images_per_s']:8.1f} {row['images_per_s_per_core']:10.1f} {ratio:>10s} "
              f"{row['images_per_cpu_s']:10.1f} {cpu_ratio:>10s}")
    print(f"load average before {load_before}, after {load_after}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
