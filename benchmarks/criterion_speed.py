"""Speed and peak memory of the E2MC criterion for one view: forward + backward.

Compares, in one run, at the paper's shapes (n = 512; d = 8192 VICReg, 128 SwAV, 2048 SimSiam):

* ``straightforward``: the paper's Algorithm 1 as written: ``d x d`` covariance and
  ``torch.sort(dim=0)`` under autograd (the reference of the ratios);
* ``gram``: the ``n x n`` Gram matrix for the covariance, sort still under autograd;
* ``e2mc``: the package (Gram path, contiguous row sort, analytic spacing backward);
* ``sigreg``: the package's SIGReg add-on (LeJEPA) at its defaults: 1024 fresh random slices,
  17 knots (the directions' draw included).

Time: median of ``--repeats`` runs after a warm-up, the variants taking turns. Peak memory:
the rise of the peak resident set size (VmHWM, reset through /proc/self/clear_refs) of a fresh
subprocess over its resident size before the first call (CPU, Linux), or
``torch.cuda.max_memory_allocated`` (GPU). Prints a table and writes JSON.

    python benchmarks/criterion_speed.py --out benchmarks/out/criterion_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from e2mc.addons import SIGReg
from e2mc.criterion import compact_transform, covariance_penalty, m_spacings_entropy
from run_meta import run_meta

SHAPES = {"VICReg": (512, 8192), "SwAV": (512, 128), "SimSiam": (512, 2048)}


def sorted_entropy(x: torch.Tensor) -> torch.Tensor:
    """Algorithm 1's m_spacings_estimator: torch.sort(dim=0) under autograd."""
    n = x.shape[0]
    m = round(n**0.5)
    s, _ = torch.sort(x, dim=0)
    return torch.log((s[m:] - s[: n - m]) * (n + 1) / m + 1e-7).sum(0).div(n - m).mean()


def straightforward(z: torch.Tensor) -> torch.Tensor:
    x = torch.sigmoid(z)
    n, d = x.shape
    entropy = sorted_entropy(x)
    xc = x - x.mean(dim=0)
    cov = xc.T @ xc / (n - 1)
    off = cov - torch.diag(torch.diag(cov))
    return -entropy + off.pow(2).sum() / d


def gram_only(z: torch.Tensor) -> torch.Tensor:
    x = torch.sigmoid(z)
    n, d = x.shape
    entropy = sorted_entropy(x)
    xc = x - x.mean(dim=0)
    total = (xc @ xc.T).pow(2).sum() if n < d else (xc.T @ xc).pow(2).sum()
    diagonal = xc.pow(2).sum(0).pow(2).sum()
    return -entropy + (total - diagonal) / ((n - 1) ** 2 * d)


def package(z: torch.Tensor) -> torch.Tensor:
    x = compact_transform(z, "hypercube")
    return -m_spacings_entropy(x).mean() + covariance_penalty(x)


_SIGREG = SIGReg(weight=1.0)


def sigreg(z: torch.Tensor) -> torch.Tensor:
    return _SIGREG([z])["loss"]


VARIANTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "straightforward": straightforward,
    "gram": gram_only,
    "e2mc": package,
    "sigreg": sigreg,
}


def step(fn: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> None:
    z.grad = None
    fn(z).backward()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_variants(n: int, d: int, device: torch.device, repeats: int) -> dict[str, float]:
    """Median seconds of one forward + backward per variant. The variants take turns within each
    repeat, so that load drifting on a shared machine hits all of them alike."""
    inputs = {name: torch.randn(n, d, device=device, requires_grad=True) for name in VARIANTS}
    for name, fn in VARIANTS.items():
        step(fn, inputs[name])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, fn in VARIANTS.items():
            sync(device)
            start = time.perf_counter()
            step(fn, inputs[name])
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


_MEMORY_PROBE = """
import sys, torch
from criterion_speed import VARIANTS, step, rss_mb
dev, n, d, name = torch.device(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
z = torch.randn(n, d, device=dev, requires_grad=True)
if dev.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(VARIANTS[name], z)
    torch.cuda.synchronize()
    print((torch.cuda.max_memory_allocated() - base) / 2**20)
else:
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak resident size (VmHWM)
    base = rss_mb("VmRSS")
    step(VARIANTS[name], z)
    print(rss_mb("VmHWM") - base)
"""


def rss_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (Linux), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_memory_mb(name: str, n: int, d: int, device: torch.device) -> float:
    """Peak extra memory of one forward + backward, measured in a fresh process."""
    args = ["", str(device), str(n), str(d), name]  # run in this folder: it imports this file
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, *args], cwd=Path(__file__).parent,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/criterion_speed.json"))
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    device = torch.device(args.device)
    rows = []
    for method, (n, d) in SHAPES.items():
        ref_time = ref_mem = None
        medians = time_variants(n, d, device, args.repeats)
        for name in VARIANTS:
            seconds = medians[name]
            memory = peak_memory_mb(name, n, d, device)
            if name == "straightforward":
                ref_time, ref_mem = seconds, memory
            rows.append({
                "shape": method, "n": n, "d": d, "variant": name,
                "median_ms": 1000 * seconds, "peak_mb": memory,
                "speedup": ref_time / seconds, "memory_ratio": ref_mem / max(memory, 1e-3),
            })
    header = (f"{'shape':8} {'n x d':>10} {'variant':16} {'median ms':>10} {'speed-up':>9} "
              f"{'peak MB':>9} {'less mem':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['shape']:8} {r['n']:>4}x{r['d']:<5} {r['variant']:16} {r['median_ms']:10.2f} "
              f"{r['speedup']:8.2f}x {r['peak_mb']:9.1f} {r['memory_ratio']:8.1f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(), "repeats": args.repeats,
            **run_meta()}
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"\nwrote {args.out}  ({meta})")


if __name__ == "__main__":
    main()
