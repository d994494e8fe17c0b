"""The evaluation-side stages: base curves, evaluation of every run, the epoch curves and the
diagnostics. The training side is in :mod:`repro.runs`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir
from repro import runs
from repro.evaluate import Evaluator
from repro.settings import ReproSettings


def eval_dir(s: ReproSettings, kind: str, run_dir: Path) -> Path:
    """``OUT/eval/<kind>/<method>/<run name>`` for a run directory under ``OUT`` (or a given
    base run)."""
    run_dir = Path(run_dir)
    return s.out / "eval" / kind / run_dir.parent.name / run_dir.name


def base_eval_dir(s: ReproSettings, kind: str, method: str) -> Path:
    return s.out / "eval" / kind / method / "base"


def random_eval_dir(s: ReproSettings, kind: str, method: str) -> Path:
    """The evaluation of the random-init floor (:func:`repro.runs.random_init_checkpoint`)."""
    return s.out / "eval" / kind / method / "random-init"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def base_curves(s: ReproSettings, ev: Evaluator, log: Any) -> None:
    """kNN top-1 of every per-epoch checkpoint of every base run -> ``curves/base.json``."""
    curves = {}
    for method in s.methods:
        points = []
        checkpoints = runs.epoch_checkpoints(runs.base_dir(s, method))
        log(f"  base curve {method}: {len(checkpoints)} per-epoch checkpoints")
        for epoch, path in checkpoints:
            point = ev.curve_point(path, s.out / "eval" / "curves" / "base" / method /
                                   f"epoch_{epoch:04d}", method, with_linear=False)
            points.append({"epoch": epoch, **point})
        curves[method] = points
    _write_json(s.out / "curves" / "base.json", curves)


def stage_eval(s: ReproSettings, ev: Evaluator, log: Any) -> None:
    """Linear probes + kNN (+ transfer) of the random-init floor, each base and each finished
    continued run."""
    if ev.transfer is None:
        log(f"  note: {ev.transfer_note}")
    for method in s.methods:
        base = RunDir(runs.base_dir(s, method)).checkpoint
        if not base.is_file():
            log(f"  {method}: no base model yet, skipped")
            continue
        floor = runs.random_init_checkpoint(s, method)
        log(f"  {method}: random init (the floor)")
        ev.main_eval(floor, random_eval_dir(s, "main", method), method)
        ev.transfer_eval(floor, random_eval_dir(s, "transfer", method), method)
        log(f"  {method}: base")
        ev.main_eval(base, base_eval_dir(s, "main", method), method)
        ev.transfer_eval(base, base_eval_dir(s, "transfer", method), method)
        for addon in s.addons_of(method):
            for seed in s.seeds:
                run_dir = runs.continue_dir(s, method, addon, seed)
                if not runs.is_done(run_dir):
                    log(f"  {method}: {run_dir.name} not trained, skipped")
                    continue
                log(f"  {method}: {run_dir.name}")
                ckpt = RunDir(run_dir).checkpoint
                ev.main_eval(ckpt, eval_dir(s, "main", run_dir), method)
                ev.transfer_eval(ckpt, eval_dir(s, "transfer", run_dir), method)


def ablation_eval(s: ReproSettings, ev: Evaluator, log: Any) -> None:
    for beta, gamma in runs.ablation_grid(s):
        run_dir = runs.ablation_dir(s, beta, gamma, s.seeds[0])
        log(f"  ablation beta={beta:g} gamma={gamma:g}: {run_dir.name}")
        ev.ablation_eval(RunDir(run_dir).checkpoint,
                         s.out / "eval" / "ablation" / f"b{beta:g}_g{gamma:g}",
                         s.ablation_method)


def epoch_curves(s: ReproSettings, ev: Evaluator, log: Any) -> None:
    """kNN and 1% linear of each per-epoch checkpoint of the long runs -> curves/epochs.json."""
    curves: dict[str, dict[str, list[dict[str, float]]]] = {}
    for method in s.long_methods:
        curves[method] = {}
        for addon in ("none", "e2mc"):
            run_dir = runs.epochs_dir(s, method, addon)
            points = []
            for epoch, path in runs.epoch_checkpoints(run_dir):
                point = ev.curve_point(path, s.out / "eval" / "curves" / "epochs" / method /
                                       run_dir.name / f"epoch_{epoch:04d}", method,
                                       with_linear=True)
                points.append({"epoch": epoch, **point})
            log(f"  epoch curve {method} {run_dir.name}: {len(points)} points")
            curves[method][runs.RUN_DIR_NAMES[addon]] = points
    _write_json(s.out / "curves" / "epochs.json", curves)


def stage_diagnostics(s: ReproSettings, log: Any) -> None:
    """``e2mc analyze`` of base, continued and +E2MC (first training seed) per method."""
    from e2mc.diagnostics.analyze import analyze

    seed = s.seeds[0]
    for method in s.methods:
        inputs = [runs.base_dir(s, method), runs.continue_dir(s, method, "none", seed),
                  runs.continue_dir(s, method, "e2mc", seed)]
        missing = [str(p) for p in inputs if not RunDir(p).checkpoint.is_file()]
        if missing:
            log(f"  {method}: skipped, missing {', '.join(missing)}")
            continue
        out = s.out / "diagnostics" / method
        stamp = [str(RunDir(p).checkpoint.stat().st_mtime_ns) for p in inputs]
        stamp_path = out / "inputs.json"
        if (out / "diagnostics.json").is_file() and stamp_path.is_file() and \
                json.loads(stamp_path.read_text()) == stamp:
            log(f"  {method}: skip (done)")
            continue
        log(f"  {method}: analyze {', '.join(p.name for p in inputs)}")
        samples = s.diagnostics_samples
        analyze([str(p) for p in inputs], s.data, out, num_samples=samples,
                image_size=s.image_size, device=s.device, knn_k=min(100, samples // 2),
                progress=s.progress)
        _write_json(stamp_path, stamp)
