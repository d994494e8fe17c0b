"""The GPU check's benchmarks (``scripts/gpu-check.sh`` runs them after the ``gpu`` tests): on
one device, each stage against its bound, measured in the same run.

- **training**: images/s of ``e2mc continue``'s trainer (``run_training``) through each input
  pipeline on generated JPEGs, against the compute bound: the same method, add-on, optimizer,
  precision and memory format stepping on random tensors already on the device;
- **criterion**: E2MC forward + backward against the paper's Algorithm 1 at the paper's shapes
  (``criterion_speed.time_variants``);
- **extraction**: ``extract_features`` images/s over the JPEGs against the backbone's forward
  pass on random tensors on the device;
- **probes**: ``eval_speed.py`` on random features of the shipped images: the batched heads
  against the multiply-add floor, and kNN.

A stage that fails is recorded with its error and the others still run. Writes
``OUT/gpu-check.json`` (the device, torch and CUDA versions, every number) and
``OUT/gpu-check.md`` (the table it prints). ``--quick`` is a small CPU-sized variant (the test
of this script runs it on the CPU).

    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu-check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from run_meta import run_meta

HERE = Path(__file__).resolve().parent

#: The ImageNet-scale sizes (VICReg ResNet-50, 8192-8192-8192 projector, 224 px); the quick ones.
FULL = {"preset": "vicreg-e2mc", "image_size": 224, "batch": 256, "steps": 30, "warmup": 8,
        "jpeg": (500, 375), "distinct": 512, "criterion_shapes": None,
        "probe_args": ["--random-features", "2048", "--epochs", "10", "--repeats", "2"]}
#: The same model and images on a CPU: fewer steps of a smaller batch (a ResNet-50 step of 256
#: images takes minutes on a few cores); the rates are per image all the same.
CPU = {**FULL, "batch": 32, "steps": 4, "warmup": 1, "distinct": 128}
QUICK = {"preset": "fmnist-vicreg-e2mc", "image_size": 28, "batch": 16, "steps": 6,
         "warmup": 2, "jpeg": (36, 32), "distinct": 16, "criterion_shapes": {"tiny": (64, 32)},
         "probe_args": ["--random-features", "16", "--epochs", "1", "--repeats", "1",
                        "--lr-multipliers", "1"]}
SIZES = {"full": FULL, "cpu": CPU, "quick": QUICK}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _config(args: argparse.Namespace, size: dict[str, Any], data: Path | None,
            pipeline: str = "pil") -> Any:
    from e2mc.config import load_config

    overrides = ["mode=pretrain", f"training.device={args.device}",
                 f"training.batch_size={size['batch']}", f"data.image_size={size['image_size']}",
                 f"training.precision={args.precision}",
                 f"training.channels_last={str(args.channels_last).lower()}",
                 f"data.pipeline={pipeline}", f"data.num_workers={args.workers}",
                 "training.log_every=1", "training.progress=false", "training.epochs=1",
                 "training.keep_epoch_checkpoints=false", f"training.max_steps={size['steps']}",
                 "data.channels=3", "model.in_channels=3"]
    if data is not None:
        overrides.append(f"data.dataset={data}")
    return load_config(size["preset"], overrides)


# ----------------------------------------------------------------------------- training
def training_bound(args: argparse.Namespace, size: dict[str, Any]) -> dict[str, Any]:
    """Images/s of the step alone: the method and add-on of the preset, its optimizer, the
    precision and memory format, on random views of the recipe's shapes on the device."""
    from e2mc.data import build_views
    from e2mc.training.build import build_addon_from_config, build_method_from_config

    cfg = _config(args, size, None)
    device = torch.device(args.device)
    torch.manual_seed(0)
    method = build_method_from_config(cfg).to(device)
    addon = build_addon_from_config(cfg, method).to(device)
    if cfg.training.channels_last:
        method.to(memory_format=torch.channels_last)
    optimizer = method.build_optimizer(lr=cfg.lr, weight_decay=cfg.optim.weight_decay,
                                       **cfg.optim.params)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.training.precision == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.training.precision)
    specs = build_views(cfg.data.recipe or method.view_recipe, cfg.data.image_size,
                        cfg.data.channels).transforms
    batch = cfg.training.batch_size
    views = [torch.randn(batch, s.channels, s.size, s.size, device=device) for s in specs]
    if cfg.training.channels_last:
        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
    method.train()

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = method(views)
        with torch.autocast(device.type, enabled=False):
            extra = addon([e.float() for e in out.embeddings])
        loss = out.loss.float() + extra["loss"].float()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(size["warmup"]):
        step()
    _sync(device)
    times = []
    for _ in range(size["steps"]):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"images_per_s": batch / median, "median_step_s": median, "batch": batch,
            "views": [s.size for s in specs], "steps": size["steps"]}


def write_jpegs(root: Path, size: dict[str, Any], n: int) -> None:
    """``n`` JPEGs under ``root/train`` in 10 classes: ``size['distinct']`` generated images,
    hard-linked under other names up to ``n`` (each is read and decoded as its own file)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic_photos import write_jpeg_folder

    distinct = write_jpeg_folder(root / "train", min(n, size["distinct"]), size["jpeg"],
                                 classes=10)
    for i in range(len(distinct), n):
        source = distinct[i % len(distinct)]
        target = root / "train" / f"class_{i % 10}" / f"link_{i:06d}.jpg"
        os.link(source, target)


def training_end_to_end(args: argparse.Namespace, size: dict[str, Any], data: Path,
                        pipeline: str, work: Path) -> dict[str, Any]:
    """Images/s of ``run_training`` (the loader, the pipeline, the step, the logging) from the
    trainer's own per-step records, the first ``warmup`` steps left out."""
    from e2mc.artifacts import RunDir
    from e2mc.training.run import run_training

    run_dir = work / f"run-{pipeline}"
    start = time.perf_counter()
    run_training(_config(args, size, data, pipeline), run_dir)
    wall = time.perf_counter() - start
    rates = [m["images_per_s"] for m in RunDir(run_dir).read_metrics() if "images_per_s" in m]
    timed = rates[size["warmup"]:] or rates
    return {"images_per_s": statistics.median(timed), "steps": len(rates), "wall_s": wall}


# ----------------------------------------------------------------------------- the rest
def criterion(args: argparse.Namespace, size: dict[str, Any]) -> list[dict[str, Any]]:
    from criterion_speed import SHAPES, time_variants

    rows = []
    for name, (n, d) in (size["criterion_shapes"] or SHAPES).items():
        medians = time_variants(n, d, torch.device(args.device), args.criterion_repeats)
        rows.append({"shape": name, "n": n, "d": d, "e2mc_ms": 1000 * medians["e2mc"],
                     "algorithm1_ms": 1000 * medians["straightforward"],
                     "speedup": medians["straightforward"] / medians["e2mc"]})
    return rows


def extraction(args: argparse.Namespace, size: dict[str, Any], data: Path) -> dict[str, Any]:
    """``extract_features`` over the JPEGs (the evaluation transform, the loader, the
    accelerator's default bf16) against the same backbone's forward on random tensors."""
    from e2mc.data import build_dataset, eval_transform
    from e2mc.evaluation.features import cpu_channels_last, extract_features
    from e2mc.training.build import build_method_from_config

    cfg = _config(args, size, None)
    device = torch.device(args.device)
    backbone = build_method_from_config(cfg).backbone.to(device).eval()
    dataset = build_dataset(str(data), "train", eval_transform(size["image_size"], 3))
    batch = args.eval_batch or size["batch"]
    extract_features(backbone, dataset, batch_size=batch, device=device, progress=False,
                     num_workers=args.workers)  # warm-up: workers, cudnn, the file cache
    start = time.perf_counter()
    features, _ = extract_features(backbone, dataset, batch_size=batch, device=device,
                                   progress=False, num_workers=args.workers)
    seconds = time.perf_counter() - start
    x = torch.randn(batch, 3, size["image_size"], size["image_size"], device=device)
    runner = cpu_channels_last(backbone, device)  # what extract_features runs (a CPU: NHWC)
    if runner is not backbone:
        x = x.contiguous(memory_format=torch.channels_last)
    autocast = device.type != "cpu"
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        for _ in range(3):
            runner(x)
        _sync(device)
        start = time.perf_counter()
        reps = max(3, -(-len(dataset) // batch))
        for _ in range(reps):
            runner(x)
        _sync(device)
    bound = reps * batch / (time.perf_counter() - start)
    return {"images_per_s": len(dataset) / seconds, "bound_images_per_s": bound,
            "share_of_bound": len(dataset) / seconds / bound, "images": len(dataset),
            "feature_dim": int(features.shape[1]), "batch": batch}


def probes(args: argparse.Namespace, size: dict[str, Any], work: Path) -> dict[str, Any]:
    out = work / "eval_speed.json"
    cmd = [sys.executable, str(HERE / "eval_speed.py"), "--data", "builtin", "--device",
           args.device, "--cache", str(work / "eval-cache"), "--out", str(out),
           *size["probe_args"]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.probe_timeout_s,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if done.returncode != 0:
        raise RuntimeError(f"eval_speed.py exited {done.returncode}: {done.stderr[-1500:]}")
    record = json.loads(out.read_text())
    return {k: record[k] for k in ("batched_over_floor_time", "speedup_per_head",
                                   "max_abs_accuracy_diff_points", "timings_s", "n_train",
                                   "feature_dim", "batched_heads", "knn_top1")}


def device_info(device: torch.device) -> dict[str, Any]:
    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count,
                    bf16=torch.cuda.is_bf16_supported())
    else:
        info["name"] = "CPU"
    return info


def table(result: dict[str, Any]) -> str:
    """The markdown table of the check."""
    dev = result["device"]
    lines = [f"GPU check on {dev['name']} ({dev['device']}), torch {dev['torch']}, CUDA "
             f"{dev['cuda']}, commit {result['meta']['commit']}; {result['wall_s']:.0f} s",
             "", "| stage | measured | bound | share of bound |", "|---|---|---|---|"]
    t = result.get("training", {})
    bound = t.get("bound", {}).get("images_per_s")
    if bound:
        lines.append(f"| training step on device tensors ({t['preset']}, batch "
                     f"{t['bound']['batch']}, {t['precision']}) | {bound:,.0f} img/s | - | 100 % |")
    for pipeline, row in t.get("pipelines", {}).items():
        if "error" in row:
            lines.append(f"| `e2mc continue`, data.pipeline={pipeline} | error: "
                         f"{row['error'][:80]} | | |")
        elif bound:
            lines.append(f"| `e2mc continue`, data.pipeline={pipeline} | "
                         f"{row['images_per_s']:,.0f} img/s | {bound:,.0f} | "
                         f"{100 * row['images_per_s'] / bound:.0f} % |")
    for row in result.get("criterion", []) if isinstance(result.get("criterion"), list) else []:
        lines.append(f"| criterion {row['shape']} ({row['n']} x {row['d']}) | "
                     f"{row['e2mc_ms']:.2f} ms | Algorithm 1: {row['algorithm1_ms']:.2f} ms | "
                     f"{row['speedup']:.2f}x Algorithm 1's speed |")
    e = result.get("extraction", {})
    if "images_per_s" in e:
        lines.append(f"| feature extraction ({e['images']} JPEGs, batch {e['batch']}) | "
                     f"{e['images_per_s']:,.0f} img/s | {e['bound_images_per_s']:,.0f} | "
                     f"{100 * e['share_of_bound']:.0f} % |")
    p = result.get("probes", {})
    if "batched_over_floor_time" in p:
        lines.append(f"| batched probes ({p['batched_heads']} heads, {p['n_train']} x "
                     f"{p['feature_dim']}) | {p['timings_s']['batched']:.2f} s | floor "
                     f"{p['timings_s']['floor']:.2f} s | {p['batched_over_floor_time']:.2f}x "
                     "the floor |")
        lines.append(f"| kNN (k = 20, 200) | {p['timings_s']['knn']:.2f} s | | |")
    tests = result.get("tests")
    if tests:
        lines.append(f"| gpu tests | {tests} | | |")
    errors = [f"{k}: {v['error']}" for k, v in result.items()
              if isinstance(v, dict) and "error" in v]
    lines += ["", *(f"error in {e}" for e in errors)]
    return "\n".join(lines).rstrip() + "\n"


def _stage(result: dict[str, Any], name: str, fn: Any, *fargs: Any) -> None:
    start = time.perf_counter()
    print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
    try:
        result[name] = fn(*fargs)
    except Exception as err:  # noqa: BLE001 - recorded; the other stages still run
        traceback.print_exc()
        result[name] = {"error": f"{type(err).__name__}: {err}"}
    print(f"gpu-check: {name} done in {time.perf_counter() - start:.1f} s", file=sys.stderr,
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="full (a GPU), cpu (the same model, a smaller batch, fewer steps) "
                             "or quick (toy sizes); default: full on CUDA, else cpu")
    parser.add_argument("--quick", action="store_true", help="--size quick (the CPU test)")
    parser.add_argument("--precision", default=None,
                        help="bf16 where the GPU has it, else fp16 on CUDA; fp32 on the CPU")
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--pipelines", default="pil,fast,device")
    parser.add_argument("--workers", type=int, default=None,
                        help="loader workers (default: the cores this process may use, less 1)")
    parser.add_argument("--eval-batch", type=int, default=0)
    parser.add_argument("--criterion-repeats", type=int, default=7)
    parser.add_argument("--probe-timeout-s", type=int, default=240)
    parser.add_argument("--stages", default="training,criterion,extraction,probes")
    parser.add_argument("--tests", default=None, help="the gpu tests' summary line")
    args = parser.parse_args(argv)
    from e2mc.processes import available_cores

    device = torch.device(args.device)
    if args.precision is None:
        args.precision = "fp32" if device.type == "cpu" else (
            "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    if args.channels_last is None:
        args.channels_last = device.type == "cuda"
    if args.workers is None:
        args.workers = max(1, available_cores() - 1)
    size_name = "quick" if args.quick else args.size or (
        "full" if device.type == "cuda" else "cpu")
    size = SIZES[size_name]
    stages = args.stages.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result: dict[str, Any] = {"device": device_info(device), "quick": size_name == "quick",
                              "size": size_name}
    with tempfile.TemporaryDirectory(prefix="e2mc-gpu-check-") as tmp:
        work = Path(tmp)
        data = work / "jpegs"
        if "training" in stages or "extraction" in stages:
            n = size["batch"] * (size["steps"] + 1)
            _stage(result, "jpegs", lambda: write_jpegs(data, size, n) or {"images": n})
        if "training" in stages:
            training: dict[str, Any] = {"preset": size["preset"], "precision": args.precision,
                                        "channels_last": args.channels_last,
                                        "workers": args.workers, "pipelines": {}}
            _stage(training, "bound", training_bound, args, size)
            for pipeline in args.pipelines.split(","):
                _stage(training["pipelines"], pipeline, training_end_to_end, args, size, data,
                       pipeline, work)
            result["training"] = training
        if "criterion" in stages:
            _stage(result, "criterion", criterion, args, size)
        if "extraction" in stages:
            _stage(result, "extraction", extraction, args, size, data)
        if "probes" in stages:
            _stage(result, "probes", probes, args, size, work)
    result["tests"] = args.tests
    result["wall_s"] = time.perf_counter() - started
    result["meta"] = run_meta()
    text = table(result)
    (args.out / "gpu-check.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "gpu-check.md").write_text(text)
    print(text)
    print(f"wrote {args.out / 'gpu-check.json'} and {args.out / 'gpu-check.md'}")
    failed = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    failed += [f"training {k}" for k, v in result.get("training", {}).get("pipelines", {}).items()
               if "error" in v]
    if "error" in result.get("training", {}).get("bound", {}):
        failed.append("training bound")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
