"""Evaluation speed: full 1%/10%/100% linear sweep x 3 seeds + kNN on Fashion-MNIST,
uncached (features extracted) vs cached (features loaded), in one run.

    PYTHONPATH=src python benchmarks/eval_speed.py --data PATH/TO/fashion-mnist \
        [--checkpoint FILE] [--arch resnet18] [--device cpu] [--out benchmarks/out/eval_speed.json]

Without ``--checkpoint`` the backbone is a random-init ``resnet18`` with the small-image stem
(1 input channel); accuracies then measure a random network, the timings are what matter.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from pathlib import Path

import torch

from e2mc.data import build_dataset, eval_transform
from e2mc.evaluation import FeatureCache, knn_classify, linear_preset, linear_sweep
from e2mc.evaluation.results import mean_se


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="Fashion-MNIST folder (IDX files) or spec")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--method", default="generic")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=512, help="feature extraction batch")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--cache", default="benchmarks/cache/eval_speed")
    p.add_argument("--out", default="benchmarks/out/eval_speed.json")
    args = p.parse_args()

    if args.checkpoint:
        from e2mc.checkpoints import load_backbone

        backbone, dim, _ = load_backbone(args.checkpoint, arch=args.arch, small_images=True,
                                         in_channels=1)
    else:
        from e2mc.models import build_backbone

        torch.manual_seed(0)
        backbone, dim = build_backbone(args.arch, small_images=True, in_channels=1)
    transform = eval_transform(args.image_size, 1)
    train = build_dataset(args.data, "train", transform)
    test = build_dataset(args.data, "test", transform)
    shutil.rmtree(args.cache, ignore_errors=True)
    cache = FeatureCache(args.cache)
    kw = {"batch_size": args.batch_size, "device": args.device,
          "num_workers": args.num_workers, "progress": True}
    timings: dict[str, dict[str, float]] = {}
    results: dict[str, object] = {}
    for mode in ("uncached", "cached"):
        t = {}
        start = time.perf_counter()
        x, y, hit_a = cache.get_or_extract(backbone, train, "bench:train", args.checkpoint, **kw)
        tx, ty, hit_b = cache.get_or_extract(backbone, test, "bench:test", args.checkpoint, **kw)
        assert hit_a == hit_b == (mode == "cached")
        t["features"] = time.perf_counter() - start
        s = time.perf_counter()
        sweep = linear_sweep(x, y, tx, ty, fractions=(0.01, 0.1, 1.0), seeds=(0, 1, 2),
                             config_for=lambda f: linear_preset(args.method, f,
                                                                epochs=args.epochs),
                             device=args.device)
        t["linear_sweep"] = time.perf_counter() - s
        s = time.perf_counter()
        knn = knn_classify(x, y, tx, ty, ks=(20, 200), device=args.device)
        t["knn"] = time.perf_counter() - s
        t["total"] = time.perf_counter() - start
        timings[mode] = t
        results = {f"linear {100 * f:g}%": mean_se([r.top1_last for _, r in runs])
                   for f, runs in sweep.items()}
        results.update({f"knn k={r.k}": r.top1 for r in knn})
        print(f"[{mode}] " + ", ".join(f"{k} {v:.1f}s" for k, v in t.items()), flush=True)

    rows = ["| stage | uncached (s) | cached (s) |", "|---|---|---|"]
    for stage in ("features", "linear_sweep", "knn", "total"):
        rows.append(f"| {stage} | {timings['uncached'][stage]:.1f} | "
                    f"{timings['cached'][stage]:.1f} |")
    print("\n".join(rows))
    for name, value in results.items():
        print(f"{name}: {value}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "timings_s": timings, "accuracy": results, "n_train": len(x), "n_test": len(tx),
        "feature_dim": dim, "arch": args.arch, "checkpoint": args.checkpoint,
        "image_size": args.image_size, "epochs": args.epochs, "method_preset": args.method,
        "device": args.device, "torch_threads": torch.get_num_threads(),
        "machine": platform.platform(), "cpu": platform.processor()}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
