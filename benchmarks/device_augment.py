"""The device half of ``data.pipeline=device``: :class:`DeviceAugment` (the photometric steps
and the normalisation, batched) on the training device, for each ImageNet view recipe.

For each recipe: the uint8 crops and parameters of ``--batch`` images come from
``FastViews(mode="device")`` (what the loader workers hand over); the device's time per image
for the photometric half is timed over ``--repeats`` batches (CUDA synchronised), and the views
are checked against the CPU pipeline's (``FastViews(mode="cpu")``, same draws): mean and max
absolute difference. With the workers' images per CPU-second (``input_pipeline.py``'s
``e2mc-device`` row), this says whether the GPU or the CPU side bounds the pipeline.

    PYTHONPATH=src python benchmarks/device_augment.py --device cuda --out device_augment.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from e2mc.data import build_views
from e2mc.data.fast_views import DeviceAugment, FastViews, collate_device_views
from run_meta import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_photos import write_jpeg_folder  # noqa: E402  (the tests' photos)

RECIPES = ("vicreg", "swav", "simsiam")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(recipe: str, paths: list[Path], device: torch.device, size: int, repeats: int
            ) -> dict:
    cpu = FastViews(build_views(recipe, size, 3), draft=False)
    dev = FastViews(build_views(recipe, size, 3), mode="device", draft=False)
    torch.manual_seed(0)
    expected = [cpu(p) for p in paths]
    torch.manual_seed(0)
    crops, params = collate_device_views([(dev(p), 0) for p in paths])
    crops = [c.to(device) for c in crops]
    params = [p.to(device) for p in params]
    augment = DeviceAugment(dev)
    out = augment([c.clone() for c in crops], params)  # warm-up, and the views compared
    diffs = [(o.cpu() - torch.stack([e[v] for e in expected])).abs()
             for v, o in enumerate(out)]
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        augment([c.clone() for c in crops], params)
        _sync(device)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"recipe": recipe, "images": len(paths), "views": len(crops),
            "seconds_per_batch": best, "ms_per_image": 1000 * best / len(paths),
            "images_per_s": len(paths) / best,
            "mean_abs_diff_vs_cpu": max(float(d.mean()) for d in diffs),
            "max_abs_diff_vs_cpu": max(float(d.max()) for d in diffs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=128, help="images per batch")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    p.add_argument("--out", type=Path, default=Path("device_augment.json"))
    args = p.parse_args()
    device = torch.device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_jpeg_folder(tmp, args.batch, classes=1)
        for recipe in args.recipes:
            rows.append(measure(recipe, paths, device, args.image_size, args.repeats))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"DeviceAugment on {name}, {args.batch} images of 500x375 per batch, "
          f"{args.image_size} px views, best of {args.repeats}")
    print("| recipe | views | ms per image | images/s | mean abs diff vs CPU | max abs diff |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['views']} | {r['ms_per_image']:.3f} | "
              f"{r['images_per_s']:.0f} | {r['mean_abs_diff_vs_cpu']:.2e} | "
              f"{r['max_abs_diff_vs_cpu']:.2e} |")
    args.out.write_text(json.dumps({"device": name, "rows": rows, **run_meta()}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
