"""Does ``torch.compile`` or the channels_last memory format speed up a training step on CPU?

One VICReg training step (two views through backbone + projector, the VICReg loss, backward,
SGD step) for each backbone, in four variants: eager NCHW, eager channels_last, compiled
(``backbone.compile()``, what ``training.compile=true`` does) NCHW and compiled channels_last.
The variants take turns (``--rounds``) so that load drifts on a shared machine hit them alike;
the table gives the median step time, images/s and the ratio to eager NCHW, and the time of the
first compiled step (compilation). Prints a table and writes JSON.

    PYTHONPATH=src python benchmarks/compile_memory_format.py --out compile.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from e2mc.methods import build_method

# backbone -> (small_images, channels, image size, batch)
MODELS = {"cnn5": (False, 1, 28, 64), "resnet18": (True, 3, 32, 16)}
VARIANTS = ("eager", "channels_last", "compile", "compile+channels_last")


def build(backbone: str, variant: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    small, channels, _, _ = MODELS[backbone]
    torch.manual_seed(0)
    method = build_method("vicreg", backbone=backbone, small_images=small, in_channels=channels,
                          projector="256-256")
    if "channels_last" in variant:
        method.to(memory_format=torch.channels_last)
    if "compile" in variant:
        method.backbone.compile()
    return method, torch.optim.SGD(method.parameters(), lr=0.01, momentum=0.9)


def step(method: torch.nn.Module, opt: torch.optim.Optimizer, views: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    loss = method(views).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbones", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("compile_memory_format.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    load_before = list(os.getloadavg())
    for backbone in args.backbones:
        small, channels, size, batch = MODELS[backbone]
        g = torch.Generator().manual_seed(0)
        views = [torch.randn(batch, channels, size, size, generator=g) for _ in range(2)]
        models = {v: build(backbone, v) for v in VARIANTS}
        first: dict[str, float] = {}
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for v, (method, opt) in models.items():  # warm-up; the first compiled step compiles
            vs = [x.contiguous(memory_format=torch.channels_last) for x in views] \
                if "channels_last" in v else views
            first[v] = step(method, opt, vs)
            step(method, opt, vs)
        for _ in range(args.rounds):
            for v, (method, opt) in models.items():
                vs = [x.contiguous(memory_format=torch.channels_last) for x in views] \
                    if "channels_last" in v else views
                times[v] += [step(method, opt, vs) for _ in range(args.steps)]
                print(f"{backbone} {v}: {statistics.median(times[v]) * 1000:.0f} ms/step",
                      file=sys.stderr)
        ref = statistics.median(times["eager"])
        for v in VARIANTS:
            med = statistics.median(times[v])
            rows.append({"backbone": backbone, "variant": v, "batch": batch, "image_size": size,
                         "median_step_s": med, "images_per_s": batch / med,
                         "speedup_vs_eager": ref / med, "first_step_s": first[v],
                         "step_times_s": times[v]})
    result = {"rows": rows, "threads": args.threads, "steps": args.steps,
              "rounds": args.rounds, "load_average_before": load_before,
              "load_average_after": list(os.getloadavg()), "machine": platform.platform(),
              "torch": torch.__version__}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'backbone':9s} {'variant':22s} {'ms/step':>8s} {'img/s':>8s} {'x eager':>8s} "
          f"{'1st step s':>10s}")
    for r in rows:
        print(f"{r['backbone']:9s} {r['variant']:22s} {r['median_step_s'] * 1000:8.0f} "
              f"{r['images_per_s']:8.1f} {r['speedup_vs_eager']:8.2f} {r['first_step_s']:10.1f}")
    print(f"load average before {load_before}, after {result['load_average_after']}; "
          f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
