"""How long the paper's protocol takes on ImageNet-1k, predicted from each stage's rate measured
here at ImageNet's shapes on synthetic data, on whatever device this runs on.

Stages and how each is measured (the bounds in the same run):

- **continued training**, 10 epochs of 1,281,167 images: ``run_training`` through the default
  pipeline on generated JPEGs (VICReg ResNet-50, 8192-8192-8192 projector, E2MC, 224 px) against
  the same step on random device tensors (``gpu_check.py``);
- **feature extraction** of the 1,281,167 training and 50,000 validation images against the
  backbone's forward pass;
- **linear 1 % and 10 %** (VICReg's probe preset: 100 epochs, 3 label seeds each): the batched
  heads (``train_linear_heads``) on random 2048-d features of 1,000 classes for a few epochs,
  scaled to 100 epochs and the fraction's images, against the multiply-add floor of the same
  products (``eval_speed.floor_seconds``);
- **kNN** (k = 20, 200) of the 50,000 validation images against the 1,281,167-image bank: a
  smaller bank, scaled by the bank's size;
- **linear 100 %** on its own line (it is not part of the 1 % answer).

Prints the table (predicted wall time and each stage's share of its bound) and writes JSON.
``--quick`` runs every stage at toy sizes (the CPU test of this script); its predictions are
still for ImageNet, from those toy rates.

    PYTHONPATH=src python benchmarks/time_to_answer.py --out benchmarks/out/time_to_answer.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gpu_check
from eval_speed import floor_seconds
from run_meta import run_meta

IMAGENET = {"train": 1_281_167, "val": 50_000, "classes": 1000, "dim": 2048, "epochs": 10}
#: Measured sizes: probe rows and epochs, kNN bank and queries.
FULL = {"probe_rows": 12_811, "probe_epochs": 3, "dim": 2048, "classes": 1000,
        "knn_bank": 262_144, "knn_queries": 10_000}
QUICK = {"probe_rows": 512, "probe_epochs": 1, "dim": 64, "classes": 10,
         "knn_bank": 2048, "knn_queries": 256}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probes(device: torch.device, size: dict[str, Any], fraction: float) -> dict[str, Any]:
    """The fraction's 3 seeded heads on ``probe_rows`` random rows for ``probe_epochs``,
    timed with its floor; the prediction scales by rows x epochs to ImageNet's fraction and the
    preset's 100 epochs."""
    from e2mc.evaluation.batched import HeadSpec, train_linear_heads
    from e2mc.evaluation.probe_settings import linear_settings

    g = torch.Generator().manual_seed(0)
    n, d, c = size["probe_rows"], size["dim"], size["classes"]
    x = torch.randn(n, d, generator=g).numpy()
    y = (np.arange(n) % c).astype(np.int64)
    preset = linear_settings("vicreg", fraction)
    config = replace(preset, epochs=size["probe_epochs"])
    heads = [HeadSpec(np.arange(n), config, seed, history=False) for seed in (0, 1, 2)]
    eval_x, eval_y = x[: min(n, 4096)], y[: min(n, 4096)]
    train_linear_heads(x, y, eval_x, eval_y, heads[:1], num_classes=c, device=device)  # warm-up
    trace: Counter = Counter()
    _sync(device)
    start = time.perf_counter()
    train_linear_heads(x, y, eval_x, eval_y, heads, num_classes=c, device=device, trace=trace)
    _sync(device)
    seconds = time.perf_counter() - start
    floor, macs = floor_seconds(trace, device, torch.float32)
    rows = round(fraction * IMAGENET["train"])
    scale = (rows * preset.epochs) / (n * size["probe_epochs"])
    scale *= (IMAGENET["dim"] * IMAGENET["classes"]) / (d * c)
    return {"measured_s": seconds, "floor_s": floor, "share_of_bound": floor / seconds,
            "multiply_adds": macs, "predicted_s": seconds * scale, "rows": rows,
            "epochs": preset.epochs, "heads": len(heads)}


def knn(device: torch.device, size: dict[str, Any]) -> dict[str, Any]:
    """kNN of ``knn_queries`` against a ``knn_bank`` bank, with the similarity products'
    floor; the prediction scales by queries x bank to ImageNet's."""
    from e2mc.evaluation.knn import knn_classify

    g = torch.Generator().manual_seed(1)
    d, c = size["dim"], size["classes"]
    bank = torch.nn.functional.normalize(torch.randn(size["knn_bank"], d, generator=g), dim=1)
    queries = torch.nn.functional.normalize(torch.randn(size["knn_queries"], d, generator=g),
                                            dim=1)
    bank_y = (np.arange(len(bank)) % c).astype(np.int64)
    query_y = (np.arange(len(queries)) % c).astype(np.int64)
    args = (bank.numpy(), bank_y, queries.numpy(), query_y)
    knn_classify(*args, ks=(20, 200), num_classes=c, device=device)  # warm-up
    _sync(device)
    start = time.perf_counter()
    knn_classify(*args, ks=(20, 200), num_classes=c, device=device)
    _sync(device)
    seconds = time.perf_counter() - start
    b, q = bank.to(device), queries.to(device)
    _sync(device)
    start = time.perf_counter()
    for lo in range(0, len(q), 1024):
        q[lo: lo + 1024] @ b.T
    _sync(device)
    floor = time.perf_counter() - start
    scale = (IMAGENET["val"] * IMAGENET["train"] * IMAGENET["dim"]) / (
        len(queries) * len(bank) * d)
    return {"measured_s": seconds, "floor_s": floor, "share_of_bound": floor / seconds,
            "predicted_s": seconds * scale, "bank": len(bank), "queries": len(queries)}


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def predict(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per stage: predicted seconds and share of its bound."""
    rows = []
    train = result.get("training", {})
    pipeline = train.get("pipelines", {}).get(train.get("default_pipeline", ""), {})
    bound = train.get("bound", {}).get("images_per_s")
    if "images_per_s" in pipeline:
        rows.append({"stage": f"continued training, {IMAGENET['epochs']} epochs",
                     "seconds": IMAGENET["epochs"] * IMAGENET["train"] / pipeline["images_per_s"],
                     "share": pipeline["images_per_s"] / bound if bound else None,
                     "rate": f"{pipeline['images_per_s']:,.0f} img/s"})
    ext = result.get("extraction", {})
    if "images_per_s" in ext:
        rows.append({"stage": "feature extraction (train + val)",
                     "seconds": (IMAGENET["train"] + IMAGENET["val"]) / ext["images_per_s"],
                     "share": ext["share_of_bound"], "rate": f"{ext['images_per_s']:,.0f} img/s"})
    for key, label in (("linear_1", "linear 1 %, 3 seeds"), ("linear_10", "linear 10 %, 3 seeds"),
                       ("knn", "kNN, k = 20 and 200"), ("linear_100", "linear 100 %, 3 seeds")):
        stage = result.get(key, {})
        if "predicted_s" in stage:
            rows.append({"stage": label, "seconds": stage["predicted_s"],
                         "share": stage["share_of_bound"], "rate": ""})
    return rows


def table(result: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    dev = result["device"]
    lines = [f"ImageNet-1k protocol predicted on {dev['name']} ({dev['device']}), torch "
             f"{dev['torch']}, commit {result['meta']['commit']}"
             + (" (--quick: toy measurements)" if result["quick"] else ""), "",
             "| stage | rate measured | predicted wall time | share of its bound |",
             "|---|---|---|---|"]
    for r in rows:
        share = f"{100 * r['share']:.0f} %" if r["share"] is not None else "-"
        lines.append(f"| {r['stage']} | {r['rate']} | {hours(r['seconds'])} | {share} |")
    by = {r["stage"]: r["seconds"] for r in rows}
    first = [s for s in by if s.startswith(("continued", "feature", "linear 1 %"))]
    if len(first) == 3:
        lines += ["", f"to the 1 % answer (training, extraction, linear 1 %): "
                      f"{hours(sum(by[s] for s in first))}"]
        rest = [s for s in by if s.startswith(("linear 10 %", "kNN"))]
        lines.append(f"with linear 10 % and kNN: {hours(sum(by[s] for s in first + rest))}")
    hundred = [s for s in by if s.startswith("linear 100 %")]
    if hundred:
        lines.append(f"linear 100 % on its own: {hours(by[hundred[0]])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/time_to_answer.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size", choices=("full", "cpu"), default=None,
                        help="the training and extraction sizes of gpu_check.py (default: full "
                             "on CUDA, else cpu)")
    parser.add_argument("--pipeline", default=None,
                        help="the training pipeline (default: device on CUDA, else fast)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--stages", default="training,extraction,probes,knn")
    parser.add_argument("--from-check", type=Path, default=None, metavar="GPU_CHECK_JSON",
                        help="take training and extraction from gpu_check.py's JSON (measured "
                             "on this device) instead of measuring them again")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    pipeline = args.pipeline or ("device" if device.type == "cuda" else "fast")
    stages = args.stages.split(",")
    size = QUICK if args.quick else FULL
    check_args = ["--device", args.device, "--out", str(args.out.parent / "gpu-check"),
                  "--pipelines", pipeline, "--stages",
                  ",".join(s for s in ("training", "extraction") if s in stages)]
    if args.quick:
        check_args.append("--quick")
    elif args.size is not None:
        check_args += ["--size", args.size]
    if args.workers is not None:
        check_args += ["--workers", str(args.workers)]
    result: dict[str, Any] = {"device": gpu_check.device_info(device), "quick": args.quick,
                              "imagenet": IMAGENET, "sizes": size}
    if args.from_check is not None or "training" in stages or "extraction" in stages:
        if args.from_check is None:
            gpu_check.main(check_args)
        measured = json.loads((args.from_check or args.out.parent / "gpu-check"
                               / "gpu-check.json").read_text())
        result["training"] = {**measured.get("training", {}), "default_pipeline": pipeline}
        result["extraction"] = measured.get("extraction", {})
    if "probes" in stages:
        for fraction, key in ((0.01, "linear_1"), (0.1, "linear_10"), (1.0, "linear_100")):
            print(f"time-to-answer: probes at {fraction:g} ...", file=sys.stderr, flush=True)
            result[key] = probes(device, size, fraction)
    if "knn" in stages:
        print("time-to-answer: kNN ...", file=sys.stderr, flush=True)
        result["knn"] = knn(device, size)
    result["meta"] = run_meta()
    rows = predict(result)
    result["predicted"] = rows
    text = table(result, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
