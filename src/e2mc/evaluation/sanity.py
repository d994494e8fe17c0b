"""What a comparison's verdicts rest on, said beside them: the flags of ``e2mc compare``, one
line each (chance, starting model, same weights, grid edge, kNN bank, dropped images, stopped
mid-epoch or mid-run, few labels; docs/evaluation.md says what each means)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from e2mc.artifacts import EvalResults

__all__ = ["chance_columns", "chance_level", "comparison_flags", "near_chance"]


def near_chance(top1: float, chance: float) -> bool:
    """Within a tenth of the way from chance to 100 %: e.g. at most 19 % with 10 balanced
    classes (a random-init network scores far above that on every data set we use)."""
    return top1 <= chance + 0.1 * (100.0 - chance)


def _test_labels(run: EvalResults) -> np.ndarray | None:
    """The test labels, from the first entry's saved predictions; None when none are saved."""
    for entry in run.entries:
        if entry.predictions:
            try:
                _, labels = run.predictions(entry)
            except ValueError:
                return None
            if labels.ndim != 1 or not len(labels):
                return None
            return labels.astype(np.int64)
    return None


def chance_level(labels: np.ndarray) -> float | None:
    """Chance (%): the share of the most common class among ``labels`` (class indices); None
    with a single class (nothing to tell apart)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64))
    if np.count_nonzero(counts) < 2:
        return None
    return 100.0 * float(counts.max()) / int(counts.sum())


def _column_means(run: EvalResults) -> dict[str, float]:
    """Each top-1 column's mean over its entries."""
    return {column: float(np.mean([e.value for e in top1])) for column in run.columns()
            if (top1 := [e for e in run.column(column) if e.primary.startswith("top1")])}


def chance_columns(run: EvalResults) -> list[str]:
    """The run's top-1 columns at or near chance (:func:`near_chance`): a difference there
    means nothing, and the verdicts say so instead of a direction."""
    labels = _test_labels(run)
    chance = None if labels is None else chance_level(labels)
    if chance is None:
        return []
    return [c for c, mean in _column_means(run).items() if near_chance(mean, chance)]


def _chance_flag(name: str, run: EvalResults) -> str | None:
    labels = _test_labels(run)
    chance = None if labels is None else chance_level(labels)
    if chance is None:
        return None
    low, learned = [], []
    for column, mean in _column_means(run).items():
        (low if near_chance(mean, chance) else learned).append(f"{column} {mean:.2f} %")
    if not low:
        return None
    where = f"({', '.join(low)}; chance {chance:.2f} %, the most common test class)"
    if learned:  # the features hold the labels: those probes learned nothing, not the model
        return (f"{name}'s {', '.join(c.rsplit(' ', 2)[0] for c in low)} at or near chance "
                f"{where} while its {', '.join(learned)} {'is' if len(learned) == 1 else 'are'} "
                "above it: those probes learned next to "
                "nothing (their settings, or too few labels), and a difference there means "
                "nothing")
    return (f"{name} is at or near chance {where}: it collapsed or learned nothing, and a "
            "difference from it means nothing")


def _knn_bank_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """kNN columns whose k exceeds the training images a class has on average: the vote then
    leans to the class frequencies, whatever the neighbours (runs evaluated alike share a
    line)."""
    alike: dict[tuple[int, int, int], list[str]] = {}
    for name, run in zip(names, runs, strict=True):
        train, labels = run.info.get("num_train"), _test_labels(run)
        if not isinstance(train, int) or labels is None:
            continue
        classes = len(np.unique(labels))
        ks = sorted({int(e.metrics["k"]) for e in run.entries
                     if e.protocol == "knn" and isinstance(e.metrics.get("k"), int | float)})
        for k in ks:
            if classes >= 2 and k > train / classes:
                alike.setdefault((k, train, classes), []).append(name)
    return [f"{' and '.join(who)}: knn k={k} votes over {k} of {train} training images, more "
            f"than the {train / classes:.0f} a class has on average ({classes} classes): the "
            "vote leans to the class frequencies, whatever the neighbours"
            for (k, train, classes), who in alike.items()]


def _start_model_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """Runs whose evaluated model is their step 0: the weights they started from (keep-best
    hands the start back when no step beat it), not trained ones."""
    out = []
    for name, run in zip(names, runs, strict=True):
        model = run.info.get("model")
        if isinstance(model, dict) and model.get("step") == 0:
            why = (" (keep-best kept it: no step beat the start on its metric)"
                   if model.get("kept_model") else "")
            out.append(f"{name} is its run's starting model, step 0{why}: its row is the "
                       "weights the run started from, not trained ones")
        elif _checkpoint_info(run).get("step") == 0:
            out.append(f"{name} is a run's step 0 ({run.info.get('checkpoint')}): its row is "
                       "the weights the run started from, not trained ones")
        elif _starting_file(run):
            out.append(f"{name} is {run.info.get('checkpoint')}, a plain state dict: starting "
                       "weights, not trained by e2mc")
    return out


def _starting_file(run: EvalResults) -> bool:
    """Whether the evaluated file is a plain state dict of a backbone that e2mc did not train
    (your starting weights; an export of a run records where it came from)."""
    info = _checkpoint_info(run)
    return info.get("format") in ("backbone", "module") and "exported" not in info


def _trained_here(run: EvalResults) -> bool:
    """Whether the evaluated weights were trained by a run (not its step 0, not a starting
    file)."""
    model = run.info.get("model")
    step = model.get("step") if isinstance(model, dict) else _checkpoint_info(run).get("step")
    return step != 0 and not _starting_file(run)


def _weights_id(run: EvalResults) -> str | None:
    stamp = run.info.get("stamp")
    return run.info.get("backbone_sha256") or (
        stamp.get("checkpoint_sha256") if isinstance(stamp, dict) else None)


def _same_weights_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    groups: dict[str, list[str]] = {}
    for name, run in zip(names, runs, strict=True):
        if (weights := _weights_id(run)) is not None:
            groups.setdefault(weights, []).append(name)
    return [f"{' and '.join(group)} are the same weights (backbone sha256 {weights[:12]}): "
            "nothing to compare, their rows differ by nothing but chance"
            for weights, group in groups.items() if len(group) > 1]


def _grid_edge_flag(name: str, run: EvalResults) -> str | None:
    from e2mc.data.subsets import fraction_label

    settings = (run.info.get("settings") or {}).get("linear") or {}
    edges: dict[str, list[str]] = {}
    probes = 0
    for entry in run.entries:
        config = entry.extra.get("config")  # the chosen lr and weight decay
        if entry.protocol != "linear" or not isinstance(config, dict):
            continue
        grid_of = (settings.get(fraction_label(entry.fraction)) if entry.fraction is not None
                   else None) or {}
        probes += 1
        for key, grid_key in (("lr", "lr_grid"), ("weight_decay", "wd_grid")):
            grid = [float(v) for v in grid_of.get(grid_key) or []]
            value = config.get(key)
            if len(grid) >= 2 and value is not None:
                side = ("smallest" if np.isclose(value, min(grid)) else
                        "largest" if np.isclose(value, max(grid)) else None)
                if side is not None:
                    edges.setdefault(f"{key} {side}", []).append(entry.column)
    if not edges:
        return None
    said = "; ".join(f"the {what.split()[1]} {what.split()[0]} of the grid in {len(cols)} of "
                     f"{probes} probes" for what, cols in edges.items())
    return (f"{name}'s linear probes chose {said}: the best value may lie beyond the grid; "
            "widen --lr-grid / --wd-grid")


def _checkpoint_info(run: EvalResults) -> dict[str, Any]:
    """What the evaluation recorded of its checkpoint (``checkpoint_info``: the training
    run's configuration, how its epochs used the images); empty when nothing was."""
    info = run.info.get("checkpoint_info")
    return info if isinstance(info, dict) else {}


def _dropped_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """One line per way of dropping images (runs trained alike share it)."""
    alike: dict[tuple, list[str]] = {}
    for name, run in zip(names, runs, strict=True):
        use = _checkpoint_info(run).get("epoch_use")
        if isinstance(use, dict) and use.get("dropped") and _trained_here(run):
            key = tuple(use.get(k) for k in ("dropped", "images", "batch", "steps"))
            alike.setdefault(key, []).append(name)
    return [f"{' and '.join(who)} {'was' if len(who) == 1 else 'were'} trained with {dropped} "
            f"of {'its' if len(who) == 1 else 'their'} {images} images left out of every epoch "
            f"(batch {batch}, {steps} step(s) per epoch; others each epoch)"
            for (dropped, images, batch, steps), who in alike.items()]


def _stopped_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """Runs whose evaluated model (the checkpoint's step, else ``training.max_steps``) is not
    the end its recorded run configuration sets, or ends inside an epoch; runs stopped alike
    share a line. A kept model (keep-best's choice) is the run's answer, not flagged here."""
    alike: dict[tuple, list[str]] = {}
    for name, run in zip(names, runs, strict=True):
        info, model = _checkpoint_info(run), run.info.get("model")
        use, cfg = info.get("epoch_use"), info.get("run_config")
        training = cfg.get("training") if isinstance(cfg, dict) else None
        if not isinstance(use, dict) or not isinstance(training, dict) or (
                isinstance(model, dict) and model.get("kept_model")):
            continue
        most, epochs, steps = training.get("max_steps"), training.get("epochs"), use.get("steps")
        if not all(isinstance(v, int) and v > 0 for v in (epochs, steps)):
            continue
        end = min(most, epochs * steps) if isinstance(most, int) and most > 0 else epochs * steps
        step = info.get("step") if isinstance(info.get("step"), int) else end
        if step < end or step % steps:
            key = (step, end, most, epochs, steps, use.get("images"), use.get("batch"))
            alike.setdefault(key, []).append(name)
    out = []
    for (step, end, most, epochs, steps, images, batch), who in alike.items():
        was = f"{' and '.join(who)} {'was' if len(who) == 1 else 'were'}"
        if step < end:  # a step from the middle of the run, whatever stopped it there
            out.append(f"{was} evaluated at step {step} of a run configured for {end} steps: "
                       "a model from the middle of the run, not its end")
            continue
        seen = (f"; its last epoch saw {(step % steps) * batch} of the {images} images"
                if isinstance(batch, int) and isinstance(images, int) else "")
        out.append(f"{was} stopped by training.max_steps={most} inside an epoch: "
                   f"{step / steps:.2f} of {epochs} epoch(s) of {steps} steps{seen}")
    return out


#: A probe column trained on fewer labelled images a class than this is flagged.
FEW_LABELS = 5
#: The protocols that train on a labelled subset of the training images.
_PROBES = ("linear", "linear-aug", "finetune")


def _labelled(entry: Any, num_train: Any) -> int | None:
    """The labelled images a probe entry trained on: recorded (``subset.size``), else about
    its fraction of the training images."""
    subset = entry.extra.get("subset")
    if isinstance(subset, dict) and isinstance(subset.get("size"), int):
        return subset["size"]
    if isinstance(num_train, int) and entry.fraction is not None:
        return round(entry.fraction * num_train)
    return None


def _few_labels_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """Probe columns trained on fewer than :data:`FEW_LABELS` labelled images a class (runs
    evaluated alike share a line)."""
    alike: dict[tuple[str, int, int], list[str]] = {}
    for name, run in zip(names, runs, strict=True):
        labels = _test_labels(run)
        if labels is None:
            continue
        classes = len(np.unique(labels))
        for column in run.columns():
            sizes = [n for e in run.column(column) if e.protocol in _PROBES
                     and (n := _labelled(e, run.info.get("num_train"))) is not None]
            if classes >= 2 and sizes and min(sizes) < FEW_LABELS * classes:
                alike.setdefault((column, min(sizes), classes), []).append(name)
    return [f"{' and '.join(who)}: {column} trains its probes on {size} labelled images, "
            f"{size / classes:.2g} a class of {classes} (fewer than {FEW_LABELS}): its number "
            "rests on a handful of images a class and moves with which ones the label seed drew"
            for (column, size, classes), who in alike.items()]


def comparison_flags(names: Sequence[str], runs: Sequence[EvalResults]) -> list[str]:
    """Every flag of the compared runs (``names[i]`` is ``runs[i]``'s), in the order of the
    module docstring."""
    flags = [f for name, run in zip(names, runs, strict=True)
             if (f := _chance_flag(name, run)) is not None]
    flags += _start_model_flags(names, runs)
    flags += _same_weights_flags(names, runs)
    flags += [f for name, run in zip(names, runs, strict=True)
              if (f := _grid_edge_flag(name, run)) is not None]
    flags += _knn_bank_flags(names, runs)
    flags += _dropped_flags(names, runs)
    flags += _stopped_flags(names, runs)
    flags += _few_labels_flags(names, runs)
    return flags
