"""What the validation monitor costs: the same continued run with and without it, in one
invocation, on the shipped Fashion-MNIST subset (or ``--data``).

Both runs hold out the same validation split (so they train on the same images); one has the
monitor on at its default interval (every epoch, plus step 0 and the end), the other has it off.
Two numbers: the monitor's share of the monitored run's own wall time (the time of its
evaluations, ``val/seconds`` in ``metrics.jsonl``, over the run's wall time: one process, one
load, the robust number on a shared machine), and the wall-clock overhead against plain runs
before and after it (``--plain-runs``; meaningful only on a quiet machine).

    python benchmarks/monitor_cost.py --epochs 5 --out benchmarks/out/monitor_cost.json
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
from e2mc.config import load_config
from e2mc.demo import BASE_CHECKPOINT
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
    parser.add_argument("--preset", default="fmnist-vicreg-e2mc")
    parser.add_argument("--data", default="builtin")
    parser.add_argument("--epochs", type=int, default=5, help="the preset's length: 5")
    parser.add_argument("--plain-runs", type=int, default=2, choices=(0, 1, 2),
                        help="unmonitored reference runs, before and after the monitored one")
    parser.add_argument("--every", type=int, help="monitor interval in steps (default: epoch)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/monitor_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plain: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(monitor: bool, name: str) -> dict[str, float]:
            return timed_run(args.preset, args.data, args.epochs, monitor, args.every,
                             args.threads, Path(tmp) / name)

        # Plain runs before and after, so that a drift in machine load favours neither side.
        if args.plain_runs >= 1:
            plain.append(run(False, "plain-1"))
        monitored = run(True, "monitored")
        if args.plain_runs == 2:
            plain.append(run(False, "plain-2"))
    share = monitored["monitor_s"] / monitored["wall_s"]
    reference = sum(p["wall_s"] for p in plain) / len(plain) if plain else None
    overhead = (monitored["wall_s"] - reference) / reference if reference else None
    result = {"preset": args.preset, "data": args.data, "epochs": args.epochs,
              "every": args.every or "epoch", "threads": args.threads,
              "machine": platform.processor() or platform.machine(),
              "plain": plain, "monitored": monitored, "overhead_fraction": overhead,
              "monitor_fraction_of_monitored_wall": share}
    rows = [("monitored", monitored)] + [(f"plain {i + 1}", p) for i, p in enumerate(plain)]
    print("| run | wall s | steps | evaluations | monitor s |\n|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['wall_s']:.1f} | {r['steps']} | {r['evaluations']} | "
              f"{r['monitor_s']:.1f} |")
    print(f"\nthe monitor's share of the monitored run's wall time: {100 * share:.1f}%"
          + (f"; wall-clock overhead against the plain runs: {100 * overhead:.1f}%"
             if overhead is not None else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
