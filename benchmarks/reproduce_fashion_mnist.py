"""The paper reproduced in miniature on Fashion-MNIST (docs/reproduction.md).

    python benchmarks/reproduce_fashion_mnist.py --data PATH/TO/fashion-mnist \
        --transfer-data PATH/TO/mnist --out benchmarks/out/repro \
        --write-docs docs/results/full.md

Stages (``--stages``, in this order): ``bases`` (VICReg, SwAV, SimSiam base models with
``e2mc pretrain``'s trainer and their kNN-vs-epoch curve), ``continue`` (continued training with
``none`` / ``e2mc`` and, for SwAV, ``vcreg`` / ``uniformity`` / ``mmcr``, several seeds),
``eval`` (linear probes at 1/10/100% labels, kNN, MNIST transfer), ``ablation`` (the
(beta, gamma) grid of Table A.2), ``epochs`` (accuracy against continued epoch up to 3x),
``diagnostics`` (``e2mc analyze`` before/after), ``report`` (results.json and results.md).
Everything is cached in ``--out``: rerunning skips finished work and resumes interrupted runs.
``--quick`` shrinks everything to a CI-sized check (< 1 minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from e2mc.config import comma_list
from repro import page, report, runs, stages
from repro.settings import METHODS, PAPER_METHODS, STAGES, ReproSettings

REPO = Path(__file__).resolve().parents[1]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(comma_list(text, int))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(comma_list(text, float))


def _pairs(text: str) -> tuple[tuple[float, float], ...]:
    try:
        return tuple((float(a), float(b)) for a, b in (p.split(":") for p in comma_list(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BETAxPRESET:GAMMAxPRESET pairs separated by "
                                         f"commas, e.g. 0:0,1:0,0:1,1:1; got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="builtin",
                   help="Fashion-MNIST: an IDX folder or 'builtin' (the shipped 10k/2k subset)")
    p.add_argument("--transfer-data", help="MNIST IDX folder for the transfer probe (skipped "
                                           "with a note when absent)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "repro")
    p.add_argument("--quick", action="store_true", help="tiny everything (CI check)")
    p.add_argument("--methods", default=",".join(PAPER_METHODS),
                   help=f"comma-separated, of {','.join(METHODS)} (default: the paper's three)")
    p.add_argument("--seeds", type=_ints, help="training seeds of the continued runs")
    p.add_argument("--addons", help="criteria of the continued runs besides 'none', for every "
                                    "method, of e2mc,vcreg,uniformity,mmcr,sigreg (default: "
                                    "e2mc, and for SwAV also vcreg,uniformity,mmcr)")
    p.add_argument("--label-seeds", type=_ints, help="label-subset seeds of the probes")
    p.add_argument("--stages", default=",".join(STAGES),
                   help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--backbone", help="backbone of the base models (default: each preset's, "
                                           "cnn5_small; DINO's vit_tiny_p4_28)")
    p.add_argument("--num-workers", type=int, default=0,
                   help="data-loading worker processes of each training run")
    p.add_argument("--image-size", type=int, help="side of the training and test images "
                                                  "(default 28, the images' own)")
    p.add_argument("--base-epochs", type=int)
    p.add_argument("--continue-epochs", type=int, help="default: 10%% of --base-epochs")
    p.add_argument("--epochs-factor", type=int, help="epochs stage: x default length (3)")
    p.add_argument("--epochs-methods", help="methods of the epochs stage (default: all)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--train-limit", type=int, help="use the first N training images")
    p.add_argument("--test-limit", type=int, help="use the first N test images")
    p.add_argument("--probe-epochs", type=int, help="linear-probe epochs (paper: 100)")
    p.add_argument("--probe-preset", choices=("method", "generic"))
    p.add_argument("--ablation-method", choices=METHODS)
    p.add_argument("--ablation-pairs", type=_pairs,
                   help="(beta, gamma) as multiples of the preset, e.g. 0:0,1:0,0:1,1:1 "
                        "(default: the paper's Table A.2 pairs)")
    p.add_argument("--base-run", action="append", default=[], metavar="METHOD=DIR",
                   help="use an existing 'e2mc pretrain' run directory as METHOD's base")
    p.add_argument("--base-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the base runs (repeatable)")
    p.add_argument("--continue-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every continued run (repeatable)")
    p.add_argument("--e2mc-set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the +E2MC runs only (repeatable), e.g. "
                        "addon.params.beta=300")
    p.add_argument("--cpu-threads", type=int, help="torch.set_num_threads for every run")
    p.add_argument("--device", default="cpu")
    p.add_argument("--write-docs", type=Path, metavar="PAGE",
                   help="also write this markdown page (e.g. docs/results/full.md) and its "
                        "figures next to it under figures/ (never with --quick "
                        "unless given)")
    return p


def settings_from(args: argparse.Namespace) -> ReproSettings:
    changes = {k: v for k, v in {
        "seeds": args.seeds, "label_seeds": args.label_seeds, "backbone": args.backbone,
        "image_size": args.image_size,
        "base_epochs": args.base_epochs, "continue_epochs": args.continue_epochs,
        "epochs_factor": args.epochs_factor, "batch_size": args.batch_size,
        "train_limit": args.train_limit, "test_limit": args.test_limit,
        "probe_epochs": args.probe_epochs, "probe_preset": args.probe_preset,
        "ablation_method": args.ablation_method, "ablation_pairs": args.ablation_pairs,
        "cpu_threads": args.cpu_threads, "num_workers": args.num_workers,
        "addons": tuple(comma_list(args.addons)) if args.addons else None,
        "epochs_methods": tuple(comma_list(args.epochs_methods)) if args.epochs_methods else None,
    }.items() if v is not None}
    base_runs = {}
    for item in args.base_run:
        method, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--base-run expects METHOD=DIR, got {item!r}")
        base_runs[method] = Path(path)
    common = dict(data=args.data, transfer_data=args.transfer_data, out=args.out,
                  methods=tuple(comma_list(args.methods)), device=args.device,
                  base_runs=base_runs, base_overrides=args.base_set,
                  continue_overrides=args.continue_set, e2mc_overrides=args.e2mc_set)
    s = (ReproSettings.quick(**common, **changes) if args.quick
         else ReproSettings(**common, **changes))
    s.validate()
    return s


def _accumulate_timing(path: Path, timing: dict[str, float]) -> dict[str, float]:
    """Add this invocation's seconds per stage to ``path`` (all invocations of an output)."""
    total = json.loads(path.read_text()) if path.is_file() else {}
    for name, seconds in timing.items():
        total[name] = total.get(name, 0.0) + seconds
    path.write_text(json.dumps(total, indent=2))
    return total


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        s = settings_from(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    chosen = comma_list(args.stages)
    unknown = [x for x in chosen if x not in STAGES]
    if unknown:
        print(f"error: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}",
              file=sys.stderr)
        return 2
    command = shlex.join(["python", "benchmarks/reproduce_fashion_mnist.py", *argv])
    s.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f} s] {text}", flush=True)

    from repro.evaluate import Evaluator

    evaluator = Evaluator(s)
    timing: dict[str, float] = {}
    plan = {
        "bases": lambda: (runs.stage_bases(s, log), stages.base_curves(s, evaluator, log)),
        "continue": lambda: runs.stage_continue(s, log),
        "eval": lambda: stages.stage_eval(s, evaluator, log),
        "ablation": lambda: (
            (runs.stage_ablation(s, log), stages.ablation_eval(s, evaluator, log))
            if s.ablation_method in s.methods
            else log(f"  skipped: --ablation-method {s.ablation_method} is not in --methods")),
        "epochs": lambda: (runs.stage_epochs(s, log), stages.epoch_curves(s, evaluator, log)),
        "diagnostics": lambda: stages.stage_diagnostics(s, log),
    }
    for name in STAGES:
        if name in chosen and name in plan:
            log(f"stage {name}")
            t0 = time.perf_counter()
            try:
                plan[name]()
            except RuntimeError as err:  # a stage whose inputs are missing
                print(f"error in stage {name}: {err}", file=sys.stderr)
                return 1
            timing[name] = time.perf_counter() - t0
    total = _accumulate_timing(s.out / "timing.json", timing)
    if "report" in chosen:
        log("stage report")
        result = report.collect(s, command, total, evaluator.transfer_note)
        (s.out / "results.json").write_text(json.dumps(result, indent=2))
        md = page.write(s, result, s.out / "results.md")
        targets = [md]
        if args.write_docs:
            targets.append(page.write(s, result, REPO / args.write_docs))
        print("\n" + "\n".join(page.summary_lines(result)))
        log(f"done: {', '.join(str(t) for t in targets)}, {s.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
