"""NVIDIA DALI's CPU pipeline beside the official PIL pipeline, images per CPU-second, one run.

The VICReg recipe in DALI operators, as solo-learn builds its DALI pipelines: per view a fused
decode + random crop (``decoders.image_random_crop``: libjpeg-turbo decodes only the crop's
region), bicubic resize, colour twist with p 0.8 (brightness/contrast 0.6-1.4, saturation
0.8-1.2, hue +-0.1 turn), grayscale p 0.2 (saturation 0), Gaussian blur (23 px, sigma 0.1-2)
with p 1.0 / 0.1, solarize with p 0 / 0.2, flip p 0.5 and normalisation, float CHW out. The
jitter's random order and PIL's exact hue arithmetic are not reproduced: a throughput
measurement, not a drop-in recipe. ``nvidia-dali-cuda120`` runs on CPU-only machines with
``device_id=None``.

    PYTHONPATH=src:PATH/TO/dali python benchmarks/input_pipeline_dali.py --out dali.json

The official side is :mod:`input_pipeline`'s (1 DataLoader worker; CPU time of the worker);
the DALI side runs ``--threads`` (1) worker threads in this process (its CPU time: the process
CPU time of the timed batches). The two take turns ``--repeats`` times; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from e2mc.data.image_folder import SafeImageFolder
from input_pipeline import make_dataset, measure
from run_meta import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_photos import write_jpeg_folder  # noqa: E402  (the tests' photos)

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def vicreg_pipeline(root: Path, size: int, batch: int, threads: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None,
                  enable_conditionals=True, seed=0)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=str(root), random_shuffle=True)
        views = []
        for p_blur, p_solarize in ((1.0, 0.0), (0.1, 0.2)):
            img = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                random_area=[0.08, 1.0],
                                                random_aspect_ratio=[3 / 4, 4 / 3])
            img = fn.resize(img, resize_x=size, resize_y=size, interp_type=types.INTERP_CUBIC,
                            antialias=True)
            if fn.random.coin_flip(probability=0.8):
                img = fn.color_twist(img, brightness=fn.random.uniform(range=[0.6, 1.4]),
                                     contrast=fn.random.uniform(range=[0.6, 1.4]),
                                     saturation=fn.random.uniform(range=[0.8, 1.2]),
                                     hue=fn.random.uniform(range=[-36.0, 36.0]))
            if fn.random.coin_flip(probability=0.2):
                img = fn.hsv(img, saturation=0.0)
            if fn.random.coin_flip(probability=p_blur):
                img = fn.gaussian_blur(img, window_size=23,
                                       sigma=fn.random.uniform(range=[0.1, 2.0]))
            if p_solarize > 0 and fn.random.coin_flip(probability=p_solarize):
                bright = fn.cast(img >= 128, dtype=types.UINT8)
                img = fn.cast(img + bright * (255 - 2 * fn.cast(img, dtype=types.INT16)),
                              dtype=types.UINT8)
            views.append(fn.crop_mirror_normalize(img, mirror=fn.random.coin_flip(),
                                                  mean=MEAN, std=STD, output_layout="CHW",
                                                  dtype=types.FLOAT))
        return tuple(views)

    p = pipe()
    p.build()
    return p


def measure_dali(pipe, images: int, batch: int) -> float:
    """Images per CPU-second of this process over ``images`` images (after one warm batch)."""
    pipe.run()
    start = time.process_time()
    done = 0
    while done < images:
        out = pipe.run()
        done += len(out[0])
    return done / (time.process_time() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("input_pipeline_dali.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    import nvidia.dali as dali

    rates: dict[str, list[float]] = {"official": [], "e2mc-fast": [], "dali-cpu": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "jpegs"
        write_jpeg_folder(root, args.generate, (500, 375), 90)
        folder = SafeImageFolder(root)
        pipe = vicreg_pipeline(root, args.image_size, args.batch, args.threads)
        for r in range(args.repeats):
            for name in rates:
                if name == "dali-cpu":
                    rate = measure_dali(pipe, args.images, args.batch)
                else:
                    ds, collate = make_dataset(name, "vicreg", folder, args.image_size)
                    rate = measure(ds, collate, 1, args.images, args.batch)[1]
                rates[name].append(rate)
                print(f"repeat {r + 1}/{args.repeats} {name:10s} {rate:7.1f} img/CPU-s",
                      file=sys.stderr)
    ref = statistics.median(rates["official"])
    rows = {name: {"images_per_cpu_s": statistics.median(v), "all_runs": v,
                   "ratio_vs_official": statistics.median(v) / ref} for name, v in rates.items()}
    record = {"recipe": "vicreg", "rows": rows, "dali": dali.__version__,
              "dali_threads": args.threads, "image_size": args.image_size,
              "jpegs": f"generated {args.generate} x 500x375 q90", **run_meta()}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:10s} {row['images_per_cpu_s']:7.1f} img/CPU-s  "
              f"{row['ratio_vs_official']:.2f}x official")
    print(f"load {record['load_1min']:.1f}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
