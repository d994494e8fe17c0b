"""What makes two evaluations comparable (``e2mc compare``): the same test images, probes
trained on the same images, labels and subsets, the same settings, recorded numbers that their
saved predictions score; and the per-image correctness of the seeds both have."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from e2mc.artifacts import RESULTS, EvalDir, EvalEntry, EvalResults
from e2mc.data.subsets import fraction_label
from e2mc.errors import InputError


def check_same_test_images(runs: list[tuple[str, Any, EvalResults]]) -> None:
    """Every row must be scored on the same test images: the same content identity
    (:func:`e2mc.data.identity.data_identity`: files and their bytes' stamps, or the arrays)
    and the same per-image labels. Otherwise an ``InputError`` naming the first that differs;
    ``--allow-mismatch`` never relaxes this (a paired test of other images means nothing)."""
    from e2mc.data.identity import describe_change, same_data

    ref_name, ref_dir, ref = runs[0]
    for _, where, run in runs:
        if run.info.get("test_data") is None:
            raise InputError(f"{where} records no content identity of its test images (made by "
                             "an older e2mc); evaluate it again to compare it")
    for name, where, run in runs[1:]:
        a, b = ref.info["test_data"], run.info["test_data"]
        if not same_data(a, b):
            raise InputError(f"cannot pair {name} with {ref_name}: they were scored on other "
                             f"test images ({describe_change(a, b, ref_name, name)}; {ref_dir} "
                             f"against {where}); a paired test needs the same images")


#: Primary metrics that are the share of the test images a saved prediction gets right.
_TOP1 = ("top1", "top1_last", "top1_best", "accuracy")


def check_value(run: EvalResults, entry: EvalEntry, correct: np.ndarray) -> None:
    """``entry``'s recorded top-1 (what the table shows) must be what its saved predictions
    score (``correct``, what the paired tests and the verdicts read), to half an image;
    otherwise an ``InputError``: the table and the verdicts would tell two numbers."""
    scored = 100 * float(correct.mean())
    if entry.primary in _TOP1 and not abs(entry.value - scored) < 50 / len(correct):
        raise InputError(f"{run.dir / RESULTS}: {entry.column!r} seed {entry.seed} records "
                         f"{entry.primary} {entry.value:.2f}, but its saved predictions score "
                         f"{scored:.2f}: the file was changed after the evaluation wrote it; "
                         f"evaluate again into {run.dir}")


def _data_difference(ref_name: str, ref: EvalResults, name: str, run: EvalResults) -> list[str]:
    """What differs between the images and labels the two runs' probes trained on (their
    ``train_data`` identity; then each common (column, seed)'s labelled subset)."""
    from e2mc.data.identity import describe_change, same_data

    a, b = ref.info.get("train_data"), run.info.get("train_data")
    if a is None or b is None:
        who = " and ".join(n for n, i in ((ref_name, a), (name, b)) if i is None)
        return [f"the probes' training images or labels ({who} recorded no identity of them: "
                "made by an older e2mc, evaluate again)"]
    if not same_data(a, b):
        return [f"the probes' training images or labels ({describe_change(a, b, ref_name, name)})"]
    for column in (c for c in ref.columns() if run.column(c)):
        for x, y in matched_entries(ref, run, column):
            ids = [(e.extra.get("subset") or {}).get("sha256") for e in (x, y)]
            if all(ids) and ids[0] != ids[1]:
                return [f"the labelled subset of {column!r} seed {y.seed} ({ref_name}: "
                        f"{ids[0][:12]}; {name}: {ids[1][:12]})"]
    return []


#: Protocols whose number depends on the report kind (``eval --report last|best``).
_PROBES = ("linear", "linear-aug", "finetune")


def differences(ref_name: str, ref: EvalResults, name: str, run: EvalResults) -> list[str]:
    """What makes ``run`` not comparable with ``ref``: the probes' training data, the image
    size, the report kind, a common column's primary metric or label seeds, a common protocol's
    label fractions."""
    def listed(values: Any) -> str:
        return ", ".join(str(v) for v in values)

    out = _data_difference(ref_name, ref, name, run)
    sizes = ref.info.get("image_size"), run.info.get("image_size")
    if all(sizes) and sizes[0] != sizes[1]:
        out.append(f"image size ({ref_name}: {sizes[0]} px; {name}: {sizes[1]} px)")
    kinds = ref.info.get("reported_epoch"), run.info.get("reported_epoch")
    if all(kinds) and kinds[0] != kinds[1] and all(
            any(e.protocol in _PROBES for e in r.entries) for r in (ref, run)):
        out.append(f"report kind ({ref_name}: {kinds[0]}; {name}: {kinds[1]})")
    protocols = dict.fromkeys(e.protocol for e in ref.entries)
    for protocol in (p for p in protocols if any(e.protocol == p for e in run.entries)):
        fractions = [sorted({e.fraction for e in r.entries
                             if e.protocol == protocol and e.fraction is not None})
                     for r in (ref, run)]
        if fractions[0] != fractions[1]:
            a, b = ([fraction_label(f) for f in fs] for fs in fractions)
            out.append(f"fractions of {protocol} ({ref_name}: {listed(a)}; {name}: {listed(b)})")
    for column in (c for c in ref.columns() if run.column(c)):
        primaries = [sorted({e.primary for e in r.column(column)}) for r in (ref, run)]
        if primaries[0] != primaries[1]:
            out.append(f"primary metric of {column!r} ({ref_name}: {listed(primaries[0])}; "
                       f"{name}: {listed(primaries[1])})")
        seeds = [sorted({e.seed for e in r.column(column)}, key=str) for r in (ref, run)]
        if seeds[0] != seeds[1]:
            out.append(f"label seeds of {column!r} ({ref_name}: {listed(seeds[0])}; "
                       f"{name}: {listed(seeds[1])})")
    return out + _setting_differences(ref_name, ref, name, run)


#: Settings that say which columns exist, not how a common column is computed.
_COLUMN_SETTINGS = {"knn": ("k", "weightings")}


def _setting_differences(ref_name: str, ref: EvalResults, name: str,
                         run: EvalResults) -> list[str]:
    """The protocols' recorded settings (``results.json`` ``settings``: a probe's epochs,
    learning rate, weight decay, standardisation, grids per label fraction; kNN's temperature
    and similarity) where both runs have the protocol (and, for a probe, the fraction) and they
    differ: the same column computed another way (another ``--method`` probe preset, another
    grid) is not a paired comparison of the models."""
    a_all, b_all = ref.info.get("settings") or {}, run.info.get("settings") or {}
    out = []
    for protocol in (p for p in a_all if p in b_all):
        a, b = a_all[protocol], b_all[protocol]
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        nested = all(isinstance(v, dict) for v in (*a.values(), *b.values()))
        pairs = ([(f"{protocol} {k}", a[k], b[k]) for k in a if k in b] if nested
                 else [(protocol, a, b)])
        for label, x, y in pairs:
            keys = [k for k in dict.fromkeys([*x, *y])
                    if k not in _COLUMN_SETTINGS.get(protocol, ()) and x.get(k) != y.get(k)]
            if keys:
                shown = [", ".join(f"{k} {_setting(r.get(k))}" for k in keys) for r in (x, y)]
                out.append(f"settings of {label} ({ref_name}: {shown[0]}; {name}: {shown[1]})")
    presets = ref.info.get("method_preset"), run.info.get("method_preset")
    if out and presets[0] != presets[1]:
        out.insert(0, f"probe preset, --method ({ref_name}: {_setting(presets[0])}; {name}: "
                      f"{_setting(presets[1])})")
    return out


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_setting(v) for v in value) + "]"
    return "-" if value is None else str(value)


def matched_correctness(reference_dir: str | os.PathLike[str], eval_dir: str | os.PathLike[str],
                        column: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(run, reference)`` per-image 0/1 correctness for every seed of ``column`` that both
    evaluation runs have (the input of :func:`pooled_permutation_test`); the two must have
    been scored on the same test images (:func:`check_same_test_images`)."""
    ref_run, run = EvalDir(reference_dir).load(), EvalDir(eval_dir).load()
    check_same_test_images([(str(reference_dir), reference_dir, ref_run),
                             (str(eval_dir), eval_dir, run)])
    return [correctness(ref_run, ref, run, e) for ref, e in matched_entries(ref_run, run, column)]


def matched_entries(reference: EvalResults, run: EvalResults, column: str
                     ) -> list[tuple[EvalEntry, EvalEntry]]:
    """``(reference entry, run entry)`` of ``column`` with the same seed, both with saved
    predictions, in the run's order."""
    out = []
    for e in run.column(column):
        if not e.predictions:
            continue
        ref = next((b for b in reference.column(column) if b.seed == e.seed), None)
        if ref is not None and ref.predictions:
            out.append((ref, e))
    return out


def correctness(base: EvalResults, ref: EvalEntry, run: EvalResults,
                 entry: EvalEntry) -> tuple[np.ndarray, np.ndarray]:
    """Per-image 0/1 correctness of ``run``'s ``entry`` and of the reference's ``ref``."""
    pred_a, labels_a = base.predictions(ref)
    pred_b, labels_b = run.predictions(entry)
    if labels_a.shape != labels_b.shape or not np.array_equal(labels_a, labels_b):
        raise ValueError(f"column {entry.column!r}, seed {entry.seed}: the two runs were "
                         "evaluated on different test sets (labels differ); paired tests "
                         "need the same images in the same order")
    # Positive difference = this run better than the reference (the first run).
    return (pred_b == labels_b).astype(np.float64), (pred_a == labels_a).astype(np.float64)
