"""``e2mc demo``: the paper's three stages on the shipped Fashion-MNIST subset, on a CPU: the
shipped VICReg ``cnn5_small`` base, continued training with add-on ``none`` and ``e2mc``, then
linear probes, kNN, paired tests against "continued" and the diagnostics (docs/demo.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir, builtin_checkpoint
from e2mc.processes import available_cores

BASE_CHECKPOINT = builtin_checkpoint("builtin:demo-vicreg")
DATA = "builtin"


@dataclass
class DemoSettings:
    """What the demo runs; :meth:`quick` is the well-under-a-minute variant for tests."""

    continued_epochs: int = 1
    train_limit: int | None = None
    test_limit: int | None = None
    max_steps: int | None = None
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2)
    probe_epochs: int = 30
    knn_k: tuple[int, ...] = (20, 200)
    analyze_samples: int = 2000
    overrides: list[str] = field(default_factory=list)
    progress: bool = True  # progress bars of training, evaluation and analysis
    check_only: bool = False  # the installation check (--quick): its verdicts mean nothing

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(continued_epochs=1, train_limit=512, test_limit=256, max_steps=2,
                   fractions=(0.1, 1.0), seeds=(0,), probe_epochs=5, knn_k=(20,),
                   analyze_samples=256, check_only=True)


def continue_config(addon: str, base: Path, settings: DemoSettings) -> Any:
    from e2mc.config import load_config

    preset = "fmnist-vicreg-e2mc" if addon == "e2mc" else "fmnist-vicreg-continued"
    overrides = [
        "model.backbone=cnn5_small", f"data.dataset={DATA}", "data.num_workers=0",
        # oneDNN's channels-last convolutions: a cnn5_small step 0.40 s instead of 0.51 s
        "training.channels_last=true",
        f"training.epochs={settings.continued_epochs}", "training.keep_epoch_checkpoints=true",
        f"training.progress={str(settings.progress).lower()}",
    ]
    if settings.train_limit is not None:
        overrides.append(f"data.limit={settings.train_limit}")
    if settings.max_steps is not None:
        overrides.append(f"training.max_steps={settings.max_steps}")
    cfg = load_config(preset, [*overrides, *settings.overrides])
    cfg.init.checkpoint = str(base)
    return cfg


def evaluate(checkpoint: Path, out_dir: Path, settings: DemoSettings, cache_dir: Path
             ) -> Any:
    """Linear probes and kNN on frozen features of the checkpoint's backbone. The ``generic``
    probe preset: the paper's VICReg one is tuned for 2048-d features and under-trains on these
    128-d ones (75 % instead of 82 % top-1 at 100 % labels)."""
    from e2mc.evaluation.runner import EvalOptions
    from e2mc.evaluation.workflow import EvalData, evaluate_checkpoint

    options = EvalOptions(protocols=("linear", "knn"), fractions=settings.fractions,
                          seeds=settings.seeds, method="generic", knn_k=settings.knn_k,
                          linear_overrides={"epochs": settings.probe_epochs},
                          progress=settings.progress)
    return evaluate_checkpoint(checkpoint, out_dir,
                               EvalData(DATA, train_limit=settings.train_limit,
                                        test_limit=settings.test_limit),
                               options, image_size=28, cache=cache_dir)


def run_demo(out_dir: str | Path, settings: DemoSettings | None = None,
             base_checkpoint: str | Path = BASE_CHECKPOINT, device: str = "cpu") -> Path:
    """Run the three stages into ``out_dir``; returns the path of the comparison markdown."""
    settings = settings or DemoSettings()
    start = time.perf_counter()
    if settings.check_only:
        print("--quick: an installation check (short runs, a small test set); its verdicts "
              "mean nothing", flush=True)
    from e2mc.diagnostics.analyze import analyze
    from e2mc.evaluation import compare_evaluations, write_comparison
    from e2mc.evaluation.compare_report import COMPARISON_STEM, print_answer
    from e2mc.evaluation.comparison_page import write_comparison_page

    out = Path(out_dir)
    base = builtin_checkpoint(base_checkpoint) or Path(base_checkpoint)
    if not base.exists():
        raise FileNotFoundError(f"base checkpoint not found: {base}")
    out.mkdir(parents=True, exist_ok=True)

    def stage(text: str) -> None:
        print(f"\n[{time.perf_counter() - start:6.1f} s] {text}", flush=True)

    configs = {}
    for addon, name in (("none", "continued"), ("e2mc", "e2mc")):
        configs[name] = continue_config(addon, base, settings)
        configs[name].training.device = device
    side_by_side = device == "cpu" and available_cores() >= len(configs)
    checkpoints = {"base": base}
    if side_by_side:
        stage(f"continued training with add-on 'none' -> {out / 'continued'} and 'e2mc' -> "
              f"{out / 'e2mc'}, side by side")
        checkpoints.update(train_side_by_side(configs, out, settings.progress))
    else:
        for name, cfg in configs.items():
            stage(f"continued training with add-on {cfg.addon.name!r} -> {out / name}")
            checkpoints[name] = _train(cfg, out / name)

    eval_dirs = {}
    for name, checkpoint in checkpoints.items():
        stage(f"linear probes {list(settings.fractions)} x seeds {list(settings.seeds)} "
              f"and kNN: {name}")
        eval_dirs[name] = out / "eval" / name
        evaluate(checkpoint, eval_dirs[name], settings, out / "feature-cache")

    stage("paired comparison against 'continued'")
    order = ["continued", "e2mc", "base"]
    comparison = compare_evaluations([str(eval_dirs[n]) for n in order], names=order)
    table_paths = write_comparison(comparison, out / COMPARISON_STEM)

    stage("diagnostics (marginals, nearest-neighbour distances, loss terms)")
    _, report = analyze([str(checkpoints["base"]), str(out / "continued"), str(out / "e2mc")],
                        DATA, out / "analysis", num_samples=settings.analyze_samples,
                        device=device, knn_k=min(100, settings.analyze_samples // 2),
                        progress=settings.progress)
    page = write_comparison_page(comparison, out, chart=table_paths[1],
                                 title="e2mc demo: E2MC against plain continued training",
                                 sections=[_diagnostics_section(report, out)])
    stage("done")
    # the answer last, on one screen: where the files are, the flags, a headline per run
    # (E2MC's last), the page
    notes = ["--quick checks the installation: its runs are too short and its test set too "
             "small for these verdicts to mean anything; run e2mc demo without --quick for "
             "the measurement"] if settings.check_only else []
    print_answer(comparison, page, files=table_paths[0], also=f"; diagnostics: {report}",
                 last="e2mc", notes=notes)
    return next(p for p in table_paths if p.suffix == ".md")


def _train(cfg: Any, run_dir: Path) -> Path:
    """The run's checkpoint, trained unless done (a picklable call for a process of its own)."""
    from e2mc.training.run import run_training

    return run_training(cfg, run_dir, done_marker=True).checkpoint


def train_side_by_side(configs: dict[str, Any], out: Path, progress: bool,
                       threads: int | None = None) -> dict[str, Path]:
    """Train the runs ``out/<name>`` at once, one process each with an equal share of the CPU
    cores (the single-threaded image pipeline bounds a run: two side by side take about the
    time of one); ``threads``: torch threads per run. A run's error is raised here."""
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
    from multiprocessing import get_context

    from e2mc.data.datasets import builtin_fashion_mnist
    from e2mc.progress import progress_bar

    threads = threads or max(1, available_cores() // len(configs))
    images = len(builtin_fashion_mnist("train"))  # the demo's data: the shipped subset
    total = 0
    for cfg in configs.values():
        cfg.training.cpu_threads = threads
        cfg.training.progress = False
        n = images if cfg.data.limit is None else min(images, cfg.data.limit)
        steps = n // cfg.training.batch_size * cfg.training.epochs
        total += steps if cfg.training.max_steps is None else min(steps, cfg.training.max_steps)
    with ProcessPoolExecutor(len(configs), mp_context=get_context("spawn")) as pool, \
            progress_bar(total=total, desc="training steps", unit="step",
                         disable=not progress) as bar:
        futures = {name: pool.submit(_train, cfg, out / name) for name, cfg in configs.items()}
        pending = set(futures.values())
        while pending:
            _, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
            done = sum(_last_step(out / name) for name in configs)
            bar.update(max(0, done - bar.n))
            failed = [f for f in futures.values() if f.done() and f.exception() is not None]
            if failed:  # the failed run's own error (the other run still ends on its own)
                raise failed[0].exception()
        return {name: f.result() for name, f in futures.items()}


def _last_step(run_dir: Path) -> int:
    """The last step a run logged (0 before its first record)."""
    try:
        rows = RunDir(run_dir).read_metrics()
    except (OSError, ValueError):  # not written yet, or a line being written
        return 0
    return int(rows[-1]["step"]) if rows else 0


def _diagnostics_section(report: Path, out: Path) -> tuple[str, str]:
    """The demo page's diagnostics: the report's verdicts, its marginals and a link."""
    import html
    import json

    found = json.loads((report.parent / "diagnostics.json").read_text()).get("verdict", [])
    link = report.relative_to(out).as_posix() if report.is_relative_to(out) else str(report)
    body = ("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in found) + "</ul>"
            f'<p>The whole report: <a href="{html.escape(link)}">{html.escape(link)}</a> '
            "(figures, training curves, statistics tables).</p>")
    marginals = report.parent / "marginals.png"
    if marginals.is_file():
        src = html.escape(marginals.relative_to(out).as_posix()
                          if marginals.is_relative_to(out) else str(marginals))
        body += (f'<figure><img src="{src}" alt="2-D marginals" style="max-width:min(900px,100%)">'
                 "<figcaption>2-D marginals of a random pair of projector dimensions, "
                 "coloured by position in the base model</figcaption></figure>")
    return ("Diagnostics: how the embeddings moved", body)
