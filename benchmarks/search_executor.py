"""Wall-clock of one ``e2mc search`` run inline (every run in the search's process, one after
another) and through the local executor (each run a process of its own, ``--max-parallel``
at a time), in one invocation, on the shipped Fashion-MNIST subset and demo base.

A 2-trial grid with its controls is 4 continued runs. Each configuration runs in a fresh search
directory as its own ``python -m e2mc search`` process (so both pay the search's own start-up),
alternating inline and local ``--repeats`` times so that a drift in machine load favours
neither. The searches must agree number for number (checked), since the runs are the same.

    python benchmarks/search_executor.py --out benchmarks/out/search_executor.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2mc.demo import BASE_CHECKPOINT


def search(out: Path, args: argparse.Namespace, steps: int, extra: list[str]) -> float:
    command = [sys.executable, "-m", "e2mc", "search", "--config", args.preset,
               "--from", str(BASE_CHECKPOINT), "--data", args.data, "--out", str(out),
               "--grid", f"optim.base_lr={args.rates}",
               "--set", f"training.max_steps={steps}",
               "--set", f"training.cpu_threads={args.threads}",
               # no loader workers: with them, a run stopped mid-epoch (max_steps) here twice
               # left persistent workers alive, which ignore SIGTERM (the pre-emption path), so
               # the inline search's process waited for them forever at its exit
               "--set", "data.num_workers=0",
               "--set", "training.progress=false", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def numbers(out: Path) -> tuple[list[dict], str | None]:
    record = json.loads((out / "search.json").read_text())
    keys = ("name", "trajectory", "control_trajectory", "difference")
    return [{k: t.get(k) for k in keys} for t in record["trials"]], record["selected"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="fmnist-vicreg-e2mc")
    parser.add_argument("--data", default="builtin")
    parser.add_argument("--rates", default="0.003,0.01", help="the grid: 2 trials")
    parser.add_argument("--steps", default="15,90",
                        help="training.max_steps of each run; a comma list: one row each")
    parser.add_argument("--threads", type=int, default=1, help="training.cpu_threads")
    parser.add_argument("--max-parallel", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/search_executor.json"))
    args = parser.parse_args()
    configs = {"inline": [],
               f"local, {args.max_parallel} parallel": ["--executor", "local", "--max-parallel",
                                                        str(args.max_parallel)]}
    steps = [int(s) for s in args.steps.split(",")]
    walls = {(n, name): [] for n in steps for name in configs}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for n in steps:
            results = {}
            for repeat in range(args.repeats):
                for i, (name, extra) in enumerate(configs.items()):
                    out = Path(tmp) / f"s{n}-r{repeat}-{i}"
                    walls[n, name].append(search(out, args, n, extra))
                    results.setdefault(name, numbers(out))
                    print(f"{n} steps, {name}: {walls[n, name][-1]:.1f} s", file=sys.stderr)
            same = same and len({json.dumps(r, sort_keys=True) for r in results.values()}) == 1
    local = list(configs)[1]
    print("\n| steps per run (4 runs: 2 trials + controls) | inline (s) | "
          f"{local} (s) | inline / local |\n|---|---|---|---|")
    medians = {f"{n} steps, {name}": statistics.median(v) for (n, name), v in walls.items()}
    for n in steps:
        a, b = medians[f"{n} steps, inline"], medians[f"{n} steps, {local}"]
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    print(f"\nsame search.json numbers: {same}; {os.cpu_count()} CPU cores; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    record = {"preset": args.preset, "data": args.data, "rates": args.rates,
              "steps": steps, "threads": args.threads, "max_parallel": args.max_parallel,
              "repeats": args.repeats, "cpus": os.cpu_count(),
              "machine": platform.processor() or platform.machine(),
              "load_average": os.getloadavg(),
              "wall_s": {f"{n} steps, {name}": v for (n, name), v in walls.items()},
              "median_s": medians, "same_numbers": same}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")
    if not same:
        sys.exit("the searches disagree: the jobs did not train what the inline search trains")


if __name__ == "__main__":
    main()
