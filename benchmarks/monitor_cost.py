"""What the validation monitor costs: the same continued run with and without it, in one
invocation, on the shipped Fashion-MNIST subset (or ``--data``).

Both runs hold out the same validation split (so they train on the same images); one has the
monitor on at its default interval (every epoch, plus step 0 and the end), the other has it off.
The overhead is ``(monitored - plain) / plain`` of the wall time; the monitor's own time per
evaluation (``val/seconds`` in ``metrics.jsonl``) is reported beside it.

    python benchmarks/monitor_cost.py --epochs 2 --out benchmarks/out/monitor_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from e2mc.artifacts import RunDir
from e2mc.demo import BASE_CHECKPOINT
from e2mc.training.config import load_config
from e2mc.training.run import run_training


def timed_run(preset: str, data: str, epochs: int, monitor: bool, every: int | None,
              threads: int, root: Path) -> dict[str, float]:
    overrides = ["mode=continue", f"init.checkpoint={BASE_CHECKPOINT}", f"data.dataset={data}",
                 "data.val_split=0.2", f"training.epochs={epochs}", "training.progress=false",
                 f"training.cpu_threads={threads}", "training.keep_epoch_checkpoints=false",
                 f"monitor.enabled={str(monitor).lower()}"]
    if monitor and every is not None:
        overrides.append(f"monitor.every={every}")
    cfg = load_config(preset, overrides)
    run_dir = root / ("monitored" if monitor else "plain")
    start = time.perf_counter()
    result = run_training(cfg, run_dir)
    wall = time.perf_counter() - start
    evals = [r["val/seconds"] for r in RunDir(run_dir).read_metrics() if "val/seconds" in r]
    return {"wall_s": wall, "steps": result.step, "evaluations": len(evals),
            "monitor_s": sum(evals), "monitor_s_per_eval": sum(evals) / max(len(evals), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="fmnist-vicreg-continue-e2mc")
    parser.add_argument("--data", default="builtin")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, help="monitor interval in steps (default: epoch)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/monitor_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        # Alternate the order so that a drift in machine load does not favour one side.
        plain = timed_run(args.preset, args.data, args.epochs, False, None, args.threads,
                          Path(tmp) / "a")
        monitored = timed_run(args.preset, args.data, args.epochs, True, args.every,
                              args.threads, Path(tmp) / "b")
        plain2 = timed_run(args.preset, args.data, args.epochs, False, None, args.threads,
                           Path(tmp) / "c")
    reference = (plain["wall_s"] + plain2["wall_s"]) / 2
    overhead = (monitored["wall_s"] - reference) / reference
    result = {"preset": args.preset, "data": args.data, "epochs": args.epochs,
              "every": args.every or "epoch", "threads": args.threads,
              "machine": platform.processor() or platform.machine(),
              "plain": [plain, plain2], "monitored": monitored,
              "overhead_fraction": overhead,
              "monitor_fraction_of_monitored_wall": monitored["monitor_s"] / monitored["wall_s"]}
    print(f"| run | wall s | steps | evaluations | monitor s |\n|---|---|---|---|---|\n"
          f"| plain (1st) | {plain['wall_s']:.1f} | {plain['steps']} | 0 | 0 |\n"
          f"| monitored | {monitored['wall_s']:.1f} | {monitored['steps']} | "
          f"{monitored['evaluations']} | {monitored['monitor_s']:.1f} |\n"
          f"| plain (2nd) | {plain2['wall_s']:.1f} | {plain2['steps']} | 0 | 0 |\n\n"
          f"overhead against the mean plain run: {100 * overhead:.1f}% of the wall time; the "
          f"monitor's own time is {100 * result['monitor_fraction_of_monitored_wall']:.1f}% of "
          "the monitored run")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
