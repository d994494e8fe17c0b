"""Evaluation speed: the sequential fixed-lr linear sweep against the batched heads, in one run
on the same cached features.

    PYTHONPATH=src python benchmarks/eval_speed.py --data PATH/TO/fashion-mnist \
        --checkpoint src/e2mc/assets/demo_base_vicreg.pt --threads 1 \
        --out benchmarks/out/eval_speed_cnn5.json
    PYTHONPATH=src python benchmarks/eval_speed.py --data PATH/TO/fashion-mnist \
        --random-features 512 --threads 1 --out benchmarks/out/eval_speed_512.json

Stages, timed separately: feature extraction (through a fresh :class:`FeatureCache`, then the
cached read), the **sequential** sweep (9 probes: 1%/10%/100% labels x 3 label seeds, the
method preset's fixed lr, one probe after another: the oracle of the batched heads,
``tests/reference.py``'s ``sequential_linear_sweep``), the **batched** path
(the same 9 probes, each over ``--lr-multipliers`` x the preset lr: 45 heads, one
:func:`train_linear_heads` call), the **floor** (the batched path's matrix products replayed as
plain ``torch.bmm`` / ``torch.mm`` on random tensors of the same shapes: the time of the same
multiply-adds with nothing else; the batched path and its floor take turns ``--repeats`` times
and ``batched_over_floor_time`` is the median of the per-turn ratios), and kNN (k = 20 and 200,
weighted and uniform, one pass).
Peak memory: CUDA's peak allocation, or on the CPU the peak resident set size above the level
before the stage (sampled every 2 ms, after ``malloc_trim`` returned freed heap pages).

JSON top level: ``speedup_per_head`` (sequential seconds per probe / batched seconds per head)
and ``max_abs_accuracy_diff_points`` (largest |top-1 difference| between a sequential probe and
the batched head at the preset lr, in points), then the details.

Without ``--checkpoint`` or ``--random-features`` the backbone is a random-init ``--arch``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from e2mc.config import comma_list
from e2mc.data import build_dataset, eval_transform
from e2mc.data.subsets import fraction_label, label_fraction_indices
from e2mc.evaluation import FeatureCache, knn_classify, linear_settings
from e2mc.evaluation.batched import HeadSpec, train_linear_heads
from run_meta import run_meta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference import sequential_linear_sweep  # noqa: E402  (the tests' oracle)

FRACTIONS = (0.01, 0.1, 1.0)
SEEDS = (0, 1, 2)


class PeakMemory:
    """Peak memory of a ``with`` block in MiB: CUDA peak allocation, or the peak RSS above the
    RSS at entry (sampled by a thread)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mib = 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        _release_free_memory()
        self._base = self._rss()
        self._max = self._base
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.is_set():
                self._max = max(self._max, self._rss())
                time.sleep(0.002)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated() - self._base) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self._max = max(self._max, self._rss())
        self.peak_mib = (self._max - self._base) / 2**20


def _release_free_memory() -> None:
    """glibc keeps freed heap pages resident; hand them back so that a later stage's
    allocations show up in the RSS instead of silently reusing them."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def floor_seconds(trace: Counter, device: torch.device, dtype: torch.dtype) -> tuple[float, int]:
    """Time of the traced matrix products as plain bmm/mm on random tensors, and their
    multiply-adds."""
    macs = 0
    tensors = {}
    for key in trace:
        if key[0] == "train":
            _, a, b, d, gc = key
            tensors[key] = (torch.randn(a, b, d, device=device, dtype=dtype),
                            torch.randn(a, d, gc, device=device, dtype=dtype),
                            torch.randn(a, b, gc, device=device, dtype=dtype))
        else:
            _, n, d, gc = key
            tensors[key] = (torch.randn(n, d, device=device, dtype=dtype),
                            torch.randn(d, gc, device=device, dtype=dtype))
    _sync(device)
    start = time.perf_counter()
    for key, count in trace.items():
        if key[0] == "train":
            x, w, g = tensors[key]
            xt = x.transpose(1, 2)
            for _ in range(count):
                torch.bmm(x, w)
                torch.bmm(xt, g)
            macs += count * 2 * key[1] * key[2] * key[3] * key[4]
        else:
            x, w = tensors[key]
            for _ in range(count):
                torch.mm(x, w)
            macs += count * key[1] * key[2] * key[3]
    _sync(device)
    return time.perf_counter() - start, macs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_backbone_for(args: argparse.Namespace) -> tuple[nn.Module, int, str]:
    if args.checkpoint:
        from e2mc.checkpoints import load_backbone

        backbone, dim, _ = load_backbone(args.checkpoint)
        return backbone, dim, f"checkpoint {Path(args.checkpoint).name}"
    torch.manual_seed(0)
    if args.random_features:
        side = args.image_size
        backbone = nn.Sequential(nn.Flatten(), nn.Linear(side * side, args.random_features),
                                 nn.ReLU())
        return backbone, args.random_features, f"random ReLU features ({args.random_features}-d)"
    from e2mc.models import build_backbone

    backbone, dim = build_backbone(args.arch, small_images=True, in_channels=1)
    return backbone, dim, f"random-init {args.arch}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="Fashion-MNIST folder (IDX files) or spec")
    p.add_argument("--checkpoint", default=None, help="e.g. src/e2mc/assets/demo_base_vicreg.pt")
    p.add_argument("--random-features", type=int, default=None, metavar="DIM",
                   help="backbone = ReLU(random linear map of the pixels) with DIM outputs")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--method", default="generic")
    p.add_argument("--lr-multipliers", default="0.1,0.3,1,3,10",
                   help="the batched grid, times the preset lr (must contain 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--repeats", type=int, default=3,
                   help="batched runs, each followed by its floor (medians reported)")
    p.add_argument("--batch-size", type=int, default=512, help="feature extraction batch")
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--cache", default="benchmarks/cache/eval_speed")
    p.add_argument("--out", default="benchmarks/out/eval_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    multipliers = comma_list(args.lr_multipliers, float)
    if 1.0 not in multipliers:
        p.error("--lr-multipliers must contain 1 (the preset lr)")
    load_before = os.getloadavg()

    backbone, dim, what = build_backbone_for(args)
    transform = eval_transform(args.image_size, 1)
    train = build_dataset(args.data, "train", transform)
    test = build_dataset(args.data, "test", transform)
    shutil.rmtree(args.cache, ignore_errors=True)
    cache = FeatureCache(args.cache)
    kw = {"batch_size": args.batch_size, "device": device, "num_workers": args.num_workers,
          "progress": False}
    timings: dict[str, float] = {}
    memory: dict[str, float] = {}

    start = time.perf_counter()
    x, y, _ = cache.get_or_extract(backbone, train, "bench:train", args.checkpoint, **kw)
    tx, ty, _ = cache.get_or_extract(backbone, test, "bench:test", args.checkpoint, **kw)
    timings["extraction"] = time.perf_counter() - start
    start = time.perf_counter()
    x, y, hit_a = cache.get_or_extract(backbone, train, "bench:train", args.checkpoint, **kw)
    tx, ty, hit_b = cache.get_or_extract(backbone, test, "bench:test", args.checkpoint, **kw)
    assert hit_a and hit_b
    timings["cached_read"] = time.perf_counter() - start
    print(f"features: {x.shape[0]} x {x.shape[1]} train, {tx.shape[0]} test; extraction "
          f"{timings['extraction']:.1f}s, cached read {timings['cached_read']:.2f}s", flush=True)

    def config_for(fraction: float):
        return linear_settings(args.method, fraction, epochs=args.epochs)

    with PeakMemory(device) as mem:
        start = time.perf_counter()
        sequential = sequential_linear_sweep(x, y, tx, ty, FRACTIONS, SEEDS, config_for,
                                             device=device)
        _sync(device)
        timings["sequential"] = time.perf_counter() - start
    memory["sequential"] = mem.peak_mib
    print(f"sequential: {timings['sequential']:.1f}s", flush=True)

    heads, where = [], []
    for fraction in FRACTIONS:
        cfg = config_for(fraction)
        for seed in SEEDS:
            idx = label_fraction_indices(y, fraction, seed)
            for m in multipliers:
                where.append((fraction, seed, m))
                heads.append(HeadSpec(idx, replace(cfg, lr=cfg.lr * m), seed))
    # the batched stage and its floor take turns (--repeats), so that a machine whose speed
    # drifts moves both; the medians and the median of the per-repeat ratios are reported
    batched_runs, floor_runs = [], []
    for _ in range(args.repeats):
        trace: Counter = Counter()
        with PeakMemory(device) as mem:
            start = time.perf_counter()
            batched = train_linear_heads(x, y, tx, ty, heads, device=device, trace=trace)
            _sync(device)
            batched_runs.append(time.perf_counter() - start)
        memory["batched"] = max(memory.get("batched", 0.0), mem.peak_mib)
        floor, macs = floor_seconds(trace, device, torch.float32)
        floor_runs.append(floor)
        print(f"batched ({len(heads)} heads): {batched_runs[-1]:.1f}s, floor {floor:.1f}s",
              flush=True)
    timings["batched"] = statistics.median(batched_runs)
    timings["floor"] = statistics.median(floor_runs)
    over_floor = statistics.median(b / f for b, f in zip(batched_runs, floor_runs, strict=True))

    with PeakMemory(device) as mem:
        start = time.perf_counter()
        knn = knn_classify(x, y, tx, ty, ks=(20, 200), device=device,
                           weightings=("weighted", "uniform"))
        timings["knn"] = time.perf_counter() - start
    memory["knn"] = mem.peak_mib

    seq_acc = {(f, s): r.top1_last for f, runs in sequential.items() for s, r in runs}
    grid: dict[str, dict[str, float]] = {}
    diffs = []
    for (fraction, seed, m), r in zip(where, batched, strict=True):
        grid.setdefault(f"{fraction_label(fraction)} seed {seed}", {})[f"x{m:g}"] = r.top1_last
        if m == 1.0:
            diffs.append(abs(r.top1_last - seq_acc[(fraction, seed)]))
    n_seq, n_heads = len(seq_acc), len(heads)
    speedup = (timings["sequential"] / n_seq) / (timings["batched"] / n_heads)
    record = {
        "speedup_per_head": speedup,
        "max_abs_accuracy_diff_points": max(diffs),
        "batched_over_sequential_time": timings["batched"] / timings["sequential"],
        "batched_over_floor_time": over_floor,
        "batched_runs_s": batched_runs, "floor_runs_s": floor_runs,
        "timings_s": timings,
        "time_split_s": {"extraction": timings["extraction"],
                         "probes": timings["batched"], "knn": timings["knn"]},
        "peak_memory_mib": memory,
        "floor_multiply_adds": macs,
        "sequential_probes": n_seq, "batched_heads": n_heads,
        "lr_multipliers": multipliers,
        "sequential_top1_last": {f"{100 * f:g}% seed {s}": v for (f, s), v in seq_acc.items()},
        "batched_top1_last": grid,
        "knn_top1": {f"k={r.k} {r.weighting}": r.top1 for r in knn},
        "n_train": int(len(x)), "n_test": int(len(tx)), "feature_dim": int(x.shape[1]),
        "backbone": what, "checkpoint": args.checkpoint, "image_size": args.image_size,
        "epochs": args.epochs, "method_preset": args.method, "device": str(device),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "load_average_before_after": [load_before, os.getloadavg()],
        "machine": platform.platform(), "cpu": platform.processor(),
        **run_meta(),
    }
    rows = ["| stage | seconds | peak memory (MiB) |", "|---|---|---|"]
    rows.append(f"| extraction (train + test) | {timings['extraction']:.1f} | |")
    rows.append(f"| cached read | {timings['cached_read']:.2f} | |")
    rows.append(f"| sequential, {n_seq} probes | {timings['sequential']:.1f} | "
                f"{memory['sequential']:.0f} |")
    rows.append(f"| batched, {n_heads} heads | {timings['batched']:.1f} | "
                f"{memory['batched']:.0f} |")
    rows.append(f"| floor (same multiply-adds, plain matmuls) | {timings['floor']:.1f} | |")
    rows.append(f"| kNN (k=20,200 x 2 weightings) | {timings['knn']:.1f} | {memory['knn']:.0f} |")
    print("\n".join(rows))
    print(f"batched / floor: {over_floor:.2f}x (median of {args.repeats}, "
          f"{', '.join(f'{b / f:.2f}' for b, f in zip(batched_runs, floor_runs, strict=True))})")
    print(f"speedup per head: {speedup:.2f}x; batched / sequential time: "
          f"{record['batched_over_sequential_time']:.2f}; max |acc diff| at the preset lr: "
          f"{max(diffs):.3f} points")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
