"""Training runs of the reproduction, all through the project's trainer
(:func:`e2mc.training.run.run_training`, the code behind ``e2mc pretrain`` / ``e2mc continue``).

A run is *done* when its last per-epoch checkpoint ``checkpoints/epoch_XXXX.pt`` exists; a done
run is skipped, an interrupted one resumes from its ``checkpoint.pt`` (the trainer's resume).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir
from repro.settings import ReproSettings

RUN_DIR_NAMES = {"none": "continued", "e2mc": "e2mc", "vcreg": "vcreg",
                 "uniformity": "uniformity", "mmcr": "mmcr", "sigreg": "sigreg"}


def epoch_checkpoint(run_dir: Path, epoch: int) -> Path:
    return RunDir(run_dir).epoch_checkpoint(epoch)


def epoch_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """``(run epoch, path)`` of the per-epoch checkpoints of a run, in order."""
    return RunDir(run_dir).epoch_checkpoints()


def is_done(run_dir: Path) -> bool:
    """Whether the run reached its configured end (its done marker,
    :meth:`e2mc.artifacts.RunDir.is_done`)."""
    return RunDir(run_dir).is_done()


def _common(s: ReproSettings, epochs: int, seed: int) -> list[str]:
    out = [*([f"model.backbone={s.backbone}"] if s.backbone else []),
           f"data.dataset={s.data}", f"data.num_workers={s.num_workers}",
           f"data.image_size={s.image_size}", f"training.epochs={epochs}",
           f"training.seed={seed}", f"training.batch_size={s.batch_size}",
           f"training.device={s.device}", "training.keep_epoch_checkpoints=true",
           f"training.progress={str(s.progress).lower()}"]
    if s.train_limit is not None:
        out.append(f"data.limit={s.train_limit}")
    if s.cpu_threads is not None:
        out.append(f"training.cpu_threads={s.cpu_threads}")
    return out


def base_config(s: ReproSettings, method: str) -> Any:
    """Preset ``fmnist-<method>-pretrain`` with the reproduction's backbone, data and length."""
    from e2mc.config import load_config

    return load_config(f"fmnist-{method}-pretrain",
                       [*_common(s, s.base_epochs, s.base_seed), *s.base_overrides])


def continue_config(s: ReproSettings, method: str, addon: str, seed: int, epochs: int,
                    start: Path, extra: list[str] | None = None) -> Any:
    """Preset ``fmnist-<method>-<addon>`` where there is one (``-e2mc``, ``-sigreg``), else
    ``fmnist-<method>-continued`` with ``addon.name`` overridden (the other criteria, whose
    parameters keep the paper's defaults), starting from ``start``."""
    from e2mc.config import load_config, preset_names

    preset = f"fmnist-{method}-{addon}"
    if preset not in preset_names():
        preset = f"fmnist-{method}-continued"
    overrides = [*_common(s, epochs, seed), f"addon.name={addon}",
                 f"init.checkpoint={start}", *s.continue_overrides,
                 *(s.e2mc_overrides if addon == "e2mc" else []), *(extra or [])]
    return load_config(preset, overrides)


def train(cfg: Any, run_dir: Path, log: Any) -> Path:
    """Train one run unless it is done (:func:`e2mc.training.run.run_training` with
    ``done_marker``, which resumes an interrupted one); returns its ``checkpoint.pt``."""
    from e2mc.training.run import run_training

    run_dir = Path(run_dir)
    if is_done(run_dir):
        log(f"  skip (done): {run_dir}")
    else:
        log(f"  train {cfg.mode} {cfg.method.name} + {cfg.addon.name} "
            f"({cfg.training.epochs} epochs, seed {cfg.training.seed}) -> {run_dir}")
    start = time.perf_counter()
    outcome = run_training(cfg, run_dir, done_marker=True)
    if not outcome.finished:
        raise RuntimeError(f"{run_dir}: training stopped at step {outcome.step} "
                           f"({outcome.stop_reason})")
    if outcome.trained:
        log(f"    {time.perf_counter() - start:.1f} s")
    return outcome.checkpoint


def base_dir(s: ReproSettings, method: str) -> Path:
    """The base run directory: ``--base-run METHOD=DIR`` or ``OUT/bases/<method>``."""
    return Path(s.base_runs.get(method, s.out / "bases" / method))


def random_init_checkpoint(s: ReproSettings, method: str) -> Path:
    """The random-init floor of ``method``: the model of the base run before its first step
    (``checkpoints/epoch_0000.pt``, which the trainer writes at the start of a fresh run: the
    same architecture, seed and initialization), else a freshly built model of the base
    preset with the base seed, written once to ``OUT/random-init/<method>.pt``."""
    saved = epoch_checkpoint(base_dir(s, method), 0)
    if saved.is_file():
        return saved
    path = s.out / "random-init" / f"{method}.pt"
    if not path.is_file():
        import torch

        from e2mc.checkpoints import save_checkpoint
        from e2mc.training.build import build_method_from_config

        torch.manual_seed(s.base_seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, build_method_from_config(base_config(s, method)), epoch=0)
    return path


def continue_dir(s: ReproSettings, method: str, addon: str, seed: int) -> Path:
    return s.out / "continue" / method / f"{RUN_DIR_NAMES[addon]}-s{seed}"


def ablation_dir(s: ReproSettings, beta: float, gamma: float, seed: int) -> Path:
    if beta == 0 and gamma == 0:  # the baseline is the "continued" run itself
        return continue_dir(s, s.ablation_method, "none", seed)
    if (beta, gamma) == e2mc_coefficients(s.ablation_method):  # the preset: the +E2MC run
        return continue_dir(s, s.ablation_method, "e2mc", seed)
    return s.out / "ablation" / s.ablation_method / f"b{beta:g}_g{gamma:g}-s{seed}"


def epochs_dir(s: ReproSettings, method: str, addon: str) -> Path:
    return s.out / "epochs" / method / f"{RUN_DIR_NAMES[addon]}-s{s.seeds[0]}"


def e2mc_coefficients(method: str) -> tuple[float, float]:
    """(beta, gamma) of the ``fmnist-<method>-e2mc`` preset."""
    from e2mc.config import load_config

    params = load_config(f"fmnist-{method}-e2mc", []).addon.params
    return float(params["beta"]), float(params["gamma"])


# --------------------------------------------------------------------------- stages
def stage_bases(s: ReproSettings, log: Any) -> None:
    for method in s.methods:
        if method in s.base_runs:
            log(f"  {method}: using the given base run {s.base_runs[method]}")
            continue
        train(base_config(s, method), base_dir(s, method), log)


def _base_checkpoint(s: ReproSettings, method: str) -> Path:
    path = RunDir(base_dir(s, method)).checkpoint
    if method not in s.base_runs and not is_done(base_dir(s, method)):
        raise RuntimeError(f"the {method} base model is not trained yet ({base_dir(s, method)});"
                           " run the 'bases' stage first")
    return path


def stage_continue(s: ReproSettings, log: Any) -> None:
    for method in s.methods:
        start = _base_checkpoint(s, method)
        for addon in s.addons_of(method):
            for seed in s.seeds:
                cfg = continue_config(s, method, addon, seed, s.continued_epochs, start)
                train(cfg, continue_dir(s, method, addon, seed), log)


def ablation_grid(s: ReproSettings) -> list[tuple[float, float]]:
    """The absolute (beta, gamma) pairs: the multiples scaled by the method's preset values."""
    beta0, gamma0 = e2mc_coefficients(s.ablation_method)
    return [(float(f"{b * beta0:.6g}"), float(f"{g * gamma0:.6g}")) for b, g in s.ablation_pairs]


def stage_ablation(s: ReproSettings, log: Any) -> None:
    method, seed = s.ablation_method, s.seeds[0]
    start = _base_checkpoint(s, method)
    for beta, gamma in ablation_grid(s):
        if beta == 0 and gamma == 0:
            cfg = continue_config(s, method, "none", seed, s.continued_epochs, start)
        else:
            cfg = continue_config(s, method, "e2mc", seed, s.continued_epochs, start,
                                  [f"addon.params.beta={beta}", f"addon.params.gamma={gamma}"])
        train(cfg, ablation_dir(s, beta, gamma, seed), log)


def stage_epochs(s: ReproSettings, log: Any) -> None:
    """Continued training up to ``epochs_factor`` x the default length (first training seed).

    With the constant learning rate of continued training, running longer is the same run
    carried on, so a finished seed-0 run of the ``continue`` stage is copied and resumed.
    """
    seed, total = s.seeds[0], s.continued_epochs * s.epochs_factor
    for method in s.long_methods:
        start = _base_checkpoint(s, method)
        for addon in ("none", "e2mc"):
            run_dir = epochs_dir(s, method, addon)
            source = continue_dir(s, method, addon, seed)
            cfg = continue_config(s, method, addon, seed, total, start)
            constant = cfg.optim.schedule == "constant"
            if not run_dir.exists() and constant and is_done(source):
                log(f"  copy {source} -> {run_dir} (carried on to {total} epochs)")
                shutil.copytree(source, run_dir)
                RunDir(run_dir).done.unlink()  # the copy goes on: not done at its new end
            train(cfg, run_dir, log)
