"""Throughput of continued training: images/s with the add-on ``none`` vs ``e2mc``.

Runs the CPU Fashion-MNIST continued-training preset of a method (default VICReg) through the
real trainer, alternating the two add-ons ``--repeats`` times (so that load drifts on a shared
machine hit both alike), each for ``--steps`` optimizer steps of which the first ``--warmup``
are not timed. Images/s per step come from the trainer's own ``metrics.jsonl`` (wall clock per
step, data loading included). Prints a table and writes JSON. Target: E2MC costs <= 5%.

    PYTHONPATH=src python benchmarks/train_throughput.py --steps 8 --out throughput.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from e2mc.artifacts import RunDir
from e2mc.checkpoints import save_checkpoint
from e2mc.config import load_config
from e2mc.training.build import build_method_from_config
from e2mc.training.run import run_training

PRESETS = {"vicreg": ("fmnist-vicreg-continued", "fmnist-vicreg-e2mc"),
           "swav": ("fmnist-swav-continued", "fmnist-swav-e2mc"),
           "simsiam": ("fmnist-simsiam-continued", "fmnist-simsiam-e2mc")}


def measure(preset: str, base: Path, work: Path, args: argparse.Namespace, tag: str) -> list[float]:
    """Images/s of the timed steps of one short continued run."""
    overrides = [f"init.checkpoint={base}", f"training.max_steps={args.steps}",
                 "training.log_every=1", "training.progress=false",
                 "training.keep_epoch_checkpoints=false", f"training.device={args.device}",
                 f"data.num_workers={args.workers}", *args.set]
    if args.batch_size:
        overrides.append(f"training.batch_size={args.batch_size}")
    cfg = load_config(preset, overrides)
    run_dir = work / tag
    run_training(cfg, run_dir)
    rates = [m["images_per_s"] for m in RunDir(run_dir).read_metrics()]
    return rates[args.warmup:]


def embedding_dim(method: str, params: dict) -> int:
    """Width of the embeddings the add-on sees (docs/method.md#where-it-is-applied)."""
    if method == "vicreg":
        return int(str(params["projector"]).split("-")[-1])
    return int(params["output_dim"] if method == "swav" else params["dim"])


def addon_ms(preset: str, batch: int, repeats: int = 20) -> float:
    """Median forward + backward time of the add-on alone on two random ``[batch, d]`` views:
    a load-robust complement to the end-to-end comparison."""
    from e2mc.addons import build_addon
    from e2mc.training.build import build_addon_from_config

    cfg = load_config(preset, [f"training.batch_size={batch}"])
    method = build_method_from_config(cfg)
    addon = build_addon_from_config(cfg, method) if cfg.addon.name != "none" else build_addon(
        "none")
    d = embedding_dim(cfg.method.name, cfg.method.params)
    z = [torch.randn(batch, d, requires_grad=True) for _ in range(2)]
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        addon(z)["loss"].backward()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=sorted(PRESETS), default="vicreg")
    parser.add_argument("--steps", type=int, default=8, help="steps per measured run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="alternations none/e2mc")
    parser.add_argument("--batch-size", type=int, default=0, help="0: the preset's (256)")
    parser.add_argument("--workers", type=int, default=2, help="data loader workers")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--set", action="append", default=[], help="extra config override")
    parser.add_argument("--out", type=Path, default=Path("train_throughput.json"))
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    if args.threads:
        torch.set_num_threads(args.threads)
    none_preset, e2mc_preset = PRESETS[args.method]
    rates: dict[str, list[float]] = {"none": [], "e2mc": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.manual_seed(0)
        base = work / "base.pt"  # throughput does not depend on the weights: a fresh model
        save_checkpoint(base, build_method_from_config(load_config(none_preset)), epoch=0)
        for r in range(args.repeats):
            for addon, preset in (("none", none_preset), ("e2mc", e2mc_preset)):
                rates[addon] += measure(preset, base, work, args, f"{addon}{r}")
                print(f"repeat {r + 1}/{args.repeats} {addon}: "
                      f"{statistics.median(rates[addon]):.1f} img/s so far", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    overhead = (med["none"] / med["e2mc"] - 1) * 100
    cfg = load_config(e2mc_preset)
    batch = args.batch_size or cfg.training.batch_size
    e2mc_ms = addon_ms(e2mc_preset, batch)
    step_ms = batch / med["none"] * 1000
    result = {
        "method": args.method, "presets": [none_preset, e2mc_preset],
        "batch_size": args.batch_size or cfg.training.batch_size,
        "backbone": cfg.model.backbone, "image_size": cfg.data.image_size,
        "device": args.device, "threads": torch.get_num_threads(), "steps_timed_per_run":
        args.steps - args.warmup, "repeats": args.repeats, "images_per_s": rates,
        "median_images_per_s": med, "e2mc_overhead_percent": overhead,
        "target_overhead_percent": 5.0, "e2mc_addon_ms_per_step": e2mc_ms,
        "step_ms_without_addon": step_ms,
        "e2mc_addon_share_percent": e2mc_ms / step_ms * 100, "machine": platform.platform(),
        "torch": torch.__version__,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'add-on':<8} {'median img/s':>13} {'min':>8} {'max':>8}  steps")
    for k, v in rates.items():
        print(f"{k:<8} {med[k]:>13.1f} {min(v):>8.1f} {max(v):>8.1f}  {len(v)}")
    print(f"E2MC time overhead end to end: {overhead:+.1f}% (target <= 5%)")
    print(f"E2MC add-on alone: {e2mc_ms:.1f} ms per step = {e2mc_ms / step_ms * 100:.1f}% of a "
          f"{step_ms:.0f} ms step; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
