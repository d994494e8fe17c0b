"""Evaluation directories of ``e2mc eval`` and the comparison of ``e2mc compare`` (its table,
its accuracy chart and its files).

Files and reader: :class:`e2mc.artifacts.EvalDir`, :class:`~e2mc.artifacts.EvalResults`.
``results.json``::

    {"checkpoint": ..., "command": [...], "data": ..., "protocols": [...], "seeds": [...],
     "fractions": [...], "settings": {...},
     "entries": [{"protocol", "column", "fraction", "seed", "primary", "metrics",
                  "predictions", "predictions_sha256"}, ...],
     "summary": {column: {metric: {"mean", "se", "n"}}}}

Each ``predictions/<name>.<generation>.npz`` has ``predictions`` (top-1 label per test image)
and ``labels``; each entry records its file's ``predictions_sha256``.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.artifacts import EvalDir, EvalEntry, EvalResults, mean_se, summarize
from e2mc.data.subsets import fraction_label
from e2mc.errors import InputError

__all__ = ["Comparison", "compare_evaluations", "comparison_markdown", "load_evaluation",
           "verdicts", "matched_correctness", "mean_se", "plot_comparison", "save_predictions",
           "summarize", "write_comparison", "write_results", "COMPARISON_STEM", "comparison_paths"]
from e2mc.evaluation.significance import (
    bootstrap_difference_ci,
    cohens_d_paired,
    mcnemar_test,
    paired_permutation_test,
    pooled_permutation_test,
)


def save_predictions(eval_dir: str | os.PathLike[str], name: str, predictions: np.ndarray,
                     labels: np.ndarray, generation: str | None = None,
                     **extra: np.ndarray) -> str:
    """Write ``predictions/<name>.<generation>.npz`` atomically and return its path relative
    to ``eval_dir`` (for the entry's ``predictions``). ``generation``: the evaluation's, from
    :meth:`EvalDir.begin`; a fresh one when not given, so that a file a complete evaluation
    references is never overwritten. ``results.json``, written last (:func:`write_results`),
    records the file's SHA-256 and makes it part of the directory."""
    from e2mc.files import atomic_write

    rel = EvalDir(eval_dir).prediction_file(name, generation or EvalDir.new_generation())
    arrays = {"predictions": np.asarray(predictions), "labels": np.asarray(labels), **extra}
    atomic_write(Path(eval_dir) / rel, lambda f: np.savez_compressed(f, **arrays), "wb")
    return rel


def write_results(eval_dir: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Write ``results.json`` atomically, with its summary (:meth:`EvalDir.write`)."""
    return EvalDir(eval_dir).write(record)


def load_evaluation(eval_dir: str | os.PathLike[str]) -> EvalResults:
    """The checked ``results.json`` of an evaluation directory (:meth:`EvalDir.load`)."""
    return EvalDir(eval_dir).load()


@dataclass
class Comparison:
    """``cells[run][column] = (mean, se, marker)``; ``tests`` one row per (run, column, seed)
    paired test against the first run."""

    runs: list[str]
    columns: list[str]
    cells: dict[str, dict[str, tuple[float, float | None, str]]]
    tests: list[dict[str, Any]] = field(default_factory=list)
    metric_note: str = ""
    pooled: list[dict[str, Any]] = field(default_factory=list)
    #: Name of the random-init floor row (shown first, tested against nothing), if any.
    floor: str | None = None
    #: ``untested[run][column]``: why a cell of a run other than the reference has no paired
    #: test (``no common seed``, ``no saved predictions``, ``not evaluated by REF``).
    untested: dict[str, dict[str, str]] = field(default_factory=dict)
    #: What differs between the runs (report kind, primary, fractions, label seeds), when they
    #: were compared anyway (``allow_mismatch``).
    mismatches: list[str] = field(default_factory=list)
    #: ``primaries[column]``: the primary metrics of the column's cells (one unless the runs
    #: were compared with ``allow_mismatch``), for the chart's axis labels.
    primaries: dict[str, list[str]] = field(default_factory=dict)

    @property
    def reference(self) -> str:
        """The run every other run is tested against: the first one after the floor."""
        return next(r for r in self.runs if r != self.floor)


#: Significance marks with their direction: the run is better (worse) than the reference.
BETTER, WORSE = "▲", "▼"
ALPHA = 0.05


def _marker(p: float, difference: float) -> str:
    """``▲`` (``▲▲`` at p < 0.01) when significantly better than the reference, ``▼`` (``▼▼``)
    when significantly worse, else nothing."""
    times = 2 if p < 0.01 else 1 if p < ALPHA else 0
    return (BETTER if difference > 0 else WORSE) * times


def compare_evaluations(eval_dirs: list[str], names: list[str] | None = None,
                 n_resamples: int = 10_000, seed: int = 0, floor: str | None = None,
                 floor_name: str = "random init", allow_mismatch: bool = False) -> Comparison:
    """Table of mean ± SE (each column's primary metric) and paired tests of every run
    against the first on the same (column, seed) test predictions.

    A cell is marked ``▲`` (better than the first run) or ``▼`` (worse), doubled at 0.01, when
    the largest p-value over its matched seeds, taking the larger of McNemar's and the
    permutation test's, is below 0.05: i.e. the difference is significant at every seed under
    both tests; the direction is the sign of the mean difference. With two or more matched
    seeds, :func:`~e2mc.evaluation.significance.pooled_permutation_test` also gives one p-value
    over all of them (``Comparison.pooled``).

    ``floor``: the evaluation of a random-init model of the same architecture (e.g. ``e2mc eval
    RUN/checkpoints/epoch_0000.pt``, the weights a pretrain run started from); it becomes the
    first row, ``floor_name``, shown for scale and tested against nothing.

    Runs (and the floor) that differ from the first in image size, report kind
    (``eval --report``), a
    column's primary metric, a protocol's label fractions or a column's label seeds are
    refused (``InputError``) unless ``allow_mismatch``; then each cell shows its own run's
    primary metric and ``Comparison.mismatches`` says what differs. A cell without a paired
    test (no seed in common with the reference, no saved predictions) is listed in
    ``Comparison.untested`` and marked ``†`` in the table, not shown as not significant.
    """
    if len(eval_dirs) < 1:
        raise ValueError("compare needs at least one run directory")
    runs = [load_evaluation(d) for d in eval_dirs]
    names = list(names) if names else evaluation_names(eval_dirs)
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} names for {len(runs)} runs")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"run names must be unique; repeated: {', '.join(repeated)}")
    if floor is not None and floor_name in names:
        raise ValueError(f"the floor's name {floor_name!r} is also a run's name")
    floor_run = load_evaluation(floor) if floor is not None else None
    _check_same_test_images([*zip(names, eval_dirs, runs, strict=True),
                             *([(floor_name, floor, floor_run)] if floor_run else [])])
    columns = list(dict.fromkeys(c for run in runs for c in run.columns()))
    others = list(zip(names[1:], runs[1:], strict=True))
    if floor_run is not None:
        others.append((floor_name, floor_run))
    differing = [(name, diffs) for name, run in others
                 if (diffs := _differences(names[0], runs[0], name, run))]
    if differing and not allow_mismatch:
        name, diffs = differing[0]
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4
                                        else "")
        raise InputError(f"cannot pair {name} with {names[0]}, they were evaluated "
                         f"differently: {shown}. Pass --allow-mismatch (allow_mismatch=True) "
                         "to compare them anyway")
    mismatches = [f"{name} against {names[0]}: {'; '.join(diffs)}" for name, diffs in differing]
    cells: dict[str, dict[str, tuple[float, float | None, str]]] = {}
    untested: dict[str, dict[str, str]] = {}
    tests: list[dict[str, Any]] = []
    pooled: list[dict[str, Any]] = []
    base = runs[0]
    for name, run in zip(names, runs, strict=True):
        cells[name] = {}
        for column in columns:
            entries = run.column(column)
            if not entries:
                continue
            mean, se = mean_se([e.value for e in entries])  # each run's own primary metric
            worst_p: float | None = None
            matched: list[tuple[np.ndarray, np.ndarray]] = []
            if run is not base:
                for ref, e in _matched_entries(base, run, column):
                    matched.append(_correctness(base, ref, run, e))
                    row = _paired_test(*matched[-1], n_resamples, seed)
                    row.update(run=name, reference=names[0], column=column, seed=e.seed)
                    tests.append(row)
                    p = max(row["mcnemar_p"], row["permutation_p"])
                    worst_p = p if worst_p is None else max(worst_p, p)
                if not matched:
                    untested.setdefault(name, {})[column] = _why_untested(
                        base, run, column, names[0])
            if len(matched) >= 2:
                diff, p = pooled_permutation_test(matched, n_resamples, seed)
                pooled.append({"run": name, "reference": names[0], "column": column,
                               "seeds": len(matched), "difference": 100 * diff,
                               "permutation_p": p})
            shift = float(np.mean([_paired_difference(*m) for m in matched])) if matched else 0.0
            cells[name][column] = (mean, se, _marker(worst_p, shift) if worst_p is not None
                                   else "")
    shown_runs = list(zip(names, runs, strict=True))
    if floor_run is not None:
        floor_cells = {}
        for column in columns:
            entries = floor_run.column(column)
            if entries:
                mean, se = mean_se([e.value for e in entries])
                floor_cells[column] = (mean, se, "")
        cells = {floor_name: floor_cells, **cells}
        names = [floor_name, *names]
        shown_runs.insert(0, (floor_name, floor_run))
    return Comparison(runs=names, columns=columns, cells=cells, tests=tests,
                      metric_note=_metric_note(columns, shown_runs), pooled=pooled,
                      floor=floor_name if floor is not None else None, untested=untested,
                      mismatches=mismatches,
                      primaries={c: list(dict.fromkeys(e.primary for _, r in shown_runs
                                                       for e in r.column(c)))
                                 for c in columns})


def _check_same_test_images(runs: list[tuple[str, Any, EvalResults]]) -> None:
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


#: Protocols whose number depends on the report kind (``eval --report last|best``).
_PROBES = ("linear", "linear-aug", "finetune")


def _differences(ref_name: str, ref: EvalResults, name: str, run: EvalResults) -> list[str]:
    """What makes ``run`` not comparable with ``ref``: the image size, the report kind, a common
    column's primary metric or label seeds, a common protocol's label fractions."""
    def listed(values: Any) -> str:
        return ", ".join(str(v) for v in values)

    out = []
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
    return out


def _why_untested(base: EvalResults, run: EvalResults, column: str, base_name: str) -> str:
    """Why ``run``'s ``column`` has no paired test against ``base``."""
    if not base.column(column):
        return f"not evaluated by {base_name}"
    if not {e.seed for e in base.column(column)} & {e.seed for e in run.column(column)}:
        return "no common seed"
    return "no saved predictions"


def _metric_note(columns: list[str], runs: list[tuple[str, EvalResults]]) -> str:
    """``column: primary`` per column; ``column: p1 (a), p2 (b)`` where the runs differ."""
    parts = []
    for column in columns:
        by_primary: dict[str, list[str]] = {}
        for name, run in runs:
            for primary in dict.fromkeys(e.primary for e in run.column(column)):
                by_primary.setdefault(primary, []).append(name)
        if len(by_primary) == 1:
            parts.append(f"{column}: {next(iter(by_primary))}")
        else:
            parts.append(f"{column}: " + ", ".join(f"{p} ({', '.join(n)})"
                                                   for p, n in by_primary.items()))
    return "; ".join(parts)


def matched_correctness(reference_dir: str | os.PathLike[str], eval_dir: str | os.PathLike[str],
                        column: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(run, reference)`` per-image 0/1 correctness for every seed of ``column`` that both
    evaluation runs have (the input of :func:`pooled_permutation_test`)."""
    ref_run, run = load_evaluation(reference_dir), load_evaluation(eval_dir)
    return [_correctness(ref_run, ref, run, e) for ref, e in _matched_entries(ref_run, run, column)]


def evaluation_names(eval_dirs: list[str]) -> list[str]:
    """Short unique names for evaluation directories: the folder name, with as many parent
    folders as it takes to tell them apart (``a/eval``, ``b/eval``)."""
    parts = [Path(d).resolve().parts for d in eval_dirs]
    depth = 1
    while True:
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names) or depth >= max(len(p) for p in parts):
            return names
        depth += 1


def _matched_entries(reference: EvalResults, run: EvalResults, column: str
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


def _correctness(base: EvalResults, ref: EvalEntry, run: EvalResults,
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


def _paired_difference(ca: np.ndarray, cb: np.ndarray) -> float:
    """The run's top-1 minus the reference's, in points (the sign every mark and verdict
    uses)."""
    return 100 * float(ca.mean() - cb.mean())


def _paired_test(ca: np.ndarray, cb: np.ndarray, n_resamples: int, seed: int
                 ) -> dict[str, Any]:
    mc = mcnemar_test(ca, cb)
    low, high = bootstrap_difference_ci(ca, cb, n_resamples=n_resamples, seed=seed)
    return {"difference": _paired_difference(ca, cb), "n10": mc.n10, "n01": mc.n01,
            "mcnemar_stat": mc.statistic, "mcnemar_p": mc.p_value, "mcnemar_method": mc.method,
            "permutation_p": paired_permutation_test(ca, cb, n_resamples, seed),
            "cohens_d": cohens_d_paired(ca, cb), "ci95_low": 100 * low, "ci95_high": 100 * high}


def _cell_text(cell: tuple[float, float | None, str] | None, untested: bool = False) -> str:
    if cell is None:
        return "-"
    mean, se, mark = cell
    return (f"{mean:.2f} ± {se:.2f}" if se is not None else f"{mean:.2f}") + mark + \
        (" †" if untested else "")


def _verdict_p(comp: Comparison, run: str, column: str, rows: list[dict[str, Any]]
               ) -> tuple[float, str]:
    """The p-value a verdict rests on and its name: pooled over seeds when there are two or
    more, else the seed's larger of McNemar's and the permutation test's."""
    pooled = next((t for t in comp.pooled if t["run"] == run and t["column"] == column), None)
    if pooled is not None:
        return pooled["permutation_p"], "pooled permutation p"
    return max(rows[0]["mcnemar_p"], rows[0]["permutation_p"]), "p"


def verdict_rows(comp: Comparison) -> list[dict[str, Any]]:
    """One dict per (run, column) tested against the reference: ``run``, ``column``, ``word``
    (``BETTER than`` / ``WORSE than`` / ``no significant difference from``), ``mean`` and
    ``se`` of the paired difference over seeds, ``seeds``, ``better`` / ``worse`` (seeds
    significant under both tests), ``p`` and its ``basis`` (:func:`_verdict_p`)."""
    rows_out = []
    for run in comp.runs:
        if run in (comp.reference, comp.floor):
            continue
        for column in comp.columns:
            rows = [t for t in comp.tests if t["run"] == run and t["column"] == column]
            if not rows:
                continue
            mean, se = mean_se(t["difference"] for t in rows)
            significant = [t for t in rows if max(t["mcnemar_p"], t["permutation_p"]) < ALPHA]
            better = sum(t["difference"] > 0 for t in significant)
            worse = sum(t["difference"] < 0 for t in significant)
            p, basis = _verdict_p(comp, run, column, rows)
            word = (("BETTER than" if mean > 0 else "WORSE than") if p < ALPHA
                    else "no significant difference from")
            rows_out.append({"run": run, "column": column, "word": word, "mean": mean, "se": se,
                             "seeds": len(rows), "better": better, "worse": worse, "p": p,
                             "basis": basis})
    return rows_out


def verdict_numbers(row: dict[str, Any]) -> str:
    """The numbers of a :func:`verdict_rows` row, in words: ``+0.87 ± 0.50 points over 3
    seed(s); 1 significantly better, 0 worse; pooled permutation p 0.042``."""
    spread = f" ± {row['se']:.2f}" if row["se"] is not None else ""
    return (f"{row['mean']:+.2f}{spread} points over {row['seeds']} seed(s); {row['better']} "
            f"significantly better, {row['worse']} worse; {row['basis']} {row['p']:.2g}")


def verdicts(comp: Comparison) -> list[str]:
    """One sentence per (run, column) tested against the reference, in words that carry the
    direction: better / worse / no significant difference, the mean difference with its SE over
    seeds, how many seeds were significantly better and worse (both tests), and the p-value the
    verdict rests on (pooled over seeds when there are two or more, else the seed's larger)."""
    return [f"{r['run']}, {r['column']}: {r['word']} {comp.reference} ({verdict_numbers(r)})"
            for r in verdict_rows(comp)]


def md_text(text: object, cell: bool = False) -> str:
    """``text`` (a user-given name) safe in the comparison's markdown: ``<``, ``>`` and ``&``
    as HTML entities (no raw HTML such as ``<script>``), one line; in a table ``cell`` also
    ``|`` escaped (``\\|``), which would otherwise end the cell."""
    import html

    out = html.escape(str(text), quote=False).replace("\r", " ").replace("\n", " ")
    return out.replace("|", "\\|") if cell else out


def comparison_markdown(comp: Comparison, per_seed: bool = True) -> str:
    """The verdicts (:func:`verdicts`) first, then the Table-1-style markdown table with its
    legend, the pooled tests and (``per_seed``) the per-seed tests. Names are escaped
    (:func:`md_text`)."""
    found = verdicts(comp)
    ref = md_text(comp.reference)
    lines = ([f"Verdict against {ref} (significance: McNemar and the paired "
              f"permutation test, p < {ALPHA:g}):", "", *[f"- {md_text(v)}" for v in found], ""]
             if found else [])
    lines += ["| run | " + " | ".join(md_text(c, True) for c in comp.columns) + " |",
              "|---|" + "---|" * len(comp.columns)]
    for run in comp.runs:
        untested = comp.untested.get(run, {})
        lines.append(f"| {md_text(run, True)} | " + " | ".join(_cell_text(comp.cells[run].get(c),
                                                           c in untested)
                                                for c in comp.columns) + " |")
    lines += ["", "Mean ± standard error over seeds (percent). Metrics: "
              f"{md_text(comp.metric_note)}.",
              f"{BETTER} better, {WORSE} worse than {ref}: p < 0.05 ({BETTER * 2} / "
              f"{WORSE * 2}: p < 0.01) at every seed under both McNemar and the paired "
              "permutation test."]
    by_reason: dict[str, list[str]] = {}
    for run, reasons in comp.untested.items():
        for column, reason in reasons.items():
            by_reason.setdefault(reason, []).append(f"{run} at {column}")
    lines += [md_text(f"† no paired test ({reason}): {', '.join(cells)}.")
              for reason, cells in by_reason.items()]
    lines += [md_text(f"Not evaluated alike, compared anyway (--allow-mismatch): {m}.")
              for m in comp.mismatches]
    if comp.floor is not None:
        lines.append(f"{md_text(comp.floor)}: the floor, a random-init model of the same "
                     "architecture (not tested).")
    if comp.pooled:
        lines += ["", "Pooled over seeds (each image's difference averaged over the matched "
                  "seeds, then the paired permutation test on the images):", "",
                  "| run | column | seeds | diff | permutation p |", "|---|---|---|---|---|"]
        lines += [f"| {md_text(t['run'], True)} | {md_text(t['column'], True)} | {t['seeds']} | "
                  f"{t['difference']:+.2f} | "
                  f"{t['permutation_p']:.3g} |" for t in comp.pooled]
    if comp.tests and per_seed:
        lines += ["", "| run | column | seed | diff | n10 | n01 | McNemar p | permutation p | "
                  "Cohen's d | 95% CI |", "|---|---|---|---|---|---|---|---|---|---|"]
        for t in comp.tests:
            lines.append(
                f"| {md_text(t['run'], True)} | {md_text(t['column'], True)} | {t['seed']} | "
                f"{t['difference']:+.2f} | "
                f"{t['n10']} | {t['n01']} | {t['mcnemar_p']:.3g} ({t['mcnemar_method']}) | "
                f"{t['permutation_p']:.3g} | {t['cohens_d']:.3f} | "
                f"[{t['ci95_low']:+.2f}, {t['ci95_high']:+.2f}] |")
    return "\n".join(lines) + "\n"


def _chart_groups(columns: list[str]) -> dict[str, list[str]]:
    """Columns grouped by protocol (the text before the first space: ``linear 1%`` ->
    ``linear``), in the order they first appear."""
    groups: dict[str, list[str]] = {}
    for column in columns:
        groups.setdefault(column.split(" ", 1)[0], []).append(column)
    return groups


#: What the x axis of a protocol's panel varies (its columns after the protocol's name).
_CHART_X = {"linear": "labels used", "linear-aug": "labels used", "finetune": "labels used",
            "knn": "neighbours k (uniform: majority vote, else similarity-weighted)"}


def _chart_metric(comp: Comparison, columns: list[str]) -> str:
    """The y label of a protocol's panel: what its cells' primary metrics measure."""
    primaries = {p for c in columns for p in comp.primaries.get(c, [])}
    if primaries and all(p.startswith("top1") or p == "accuracy" for p in primaries):
        return "top-1 accuracy (%)"
    if primaries == {"mAP"}:
        return "mAP (%)"
    return "primary metric (%, see the table)"


def _chart_differences(comp: Comparison, run: str, column: str
                       ) -> tuple[float, float, bool] | None:
    """``(mean paired difference from the reference in points, its SE over seeds or 0,
    significant by the verdict's test)`` of ``run`` at ``column``; None when untested."""
    rows = [t for t in comp.tests if t["run"] == run and t["column"] == column]
    if not rows:
        return None
    mean, se = mean_se(t["difference"] for t in rows)
    return mean, se or 0.0, _verdict_p(comp, run, column, rows)[0] < ALPHA


def plot_comparison(comp: Comparison, path: str | os.PathLike[str], dpi: int = 120) -> Path:
    """One panel per protocol; within it, the columns (label fractions, k, ...) along x and one
    marker per run, offset side by side, with a bar of +- one standard error over seeds (none
    for a single seed). Runs significantly different from the reference at every seed
    (``▲``/``▼`` in the table) are labelled so, cells without a paired test ``†``. The y range
    follows the data, so differences of a fraction of a point stay visible.

    When runs were tested against the reference, a second row shows what the verdicts
    (:func:`verdicts`) rest on: each run's paired difference from the reference in points
    (mean +- SE over seeds), a filled marker where the verdict's test is significant, a hollow
    one where it is not, around a line at 0 (the reference). The legend, below the panels, names
    the reference and the floor and explains the marks."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    groups = _chart_groups(comp.columns)
    tested = [r for r in comp.runs if r not in (comp.reference, comp.floor)
              and any(t["run"] == r for t in comp.tests)]
    widths = [max(2.2, 1.2 * len(cols)) for cols in groups.values()]
    rows = 2 if tested else 1
    fig, axes = plt.subplots(rows, len(groups), figsize=(sum(widths) + 1.0, 3.4 * rows + 1.0),
                             squeeze=False, gridspec_kw={"width_ratios": widths},
                             layout="constrained")
    n = len(comp.runs)
    offsets = [(i - (n - 1) / 2) * min(0.8 / max(n, 1), 0.2) for i in range(n)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def style(i: int, run: str) -> dict[str, Any]:
        return ({"color": "0.45", "marker": "x"} if run == comp.floor else
                {"color": colors[i % len(colors)], "marker": "o"})

    compared = any(r not in (comp.reference, comp.floor) for r in comp.runs)

    def name(run: str) -> str:
        return (f"{run} (reference)" if run == comp.reference and compared else
                f"{run} (floor, not tested)" if run == comp.floor else run)

    handles: dict[str, Any] = {}
    for g, (protocol, columns) in enumerate(groups.items()):
        ax = axes[0][g]
        one_seed = True
        for i, run in enumerate(comp.runs):
            xs, ys, es, marks = [], [], [], []
            for j, column in enumerate(columns):
                cell = comp.cells[run].get(column)
                if cell is None:
                    continue
                mean, se, mark = cell
                one_seed = one_seed and se is None
                if column in comp.untested.get(run, {}):
                    mark = "†"  # no paired test: not "not significant"
                xs.append(j + offsets[i])
                ys.append(mean)
                es.append(se or 0.0)
                marks.append(mark)
            if not xs:
                continue
            handles[run] = ax.errorbar(xs, ys, yerr=es, linestyle="none", capsize=3,
                                       markersize=5, **style(i, run))
            for x, y, e, mark in zip(xs, ys, es, marks, strict=True):
                if mark:
                    ax.annotate(mark, (x, y + e), xytext=(0, 4), textcoords="offset points",
                                ha="center", va="bottom", fontsize=9,
                                color=style(i, run)["color"])
        metric = _chart_metric(comp, columns)
        ax.set_title(f"{protocol}: " + ("one seed, no error bar" if one_seed
                                        else "mean ± SE over seeds"), fontsize=9)
        ax.set_ylabel(metric, fontsize=8)
        if rows == 2:
            low = axes[1][g]
            low.axhline(0.0, color=colors[comp.runs.index(comp.reference) % len(colors)],
                        lw=1.0, ls="--")
            for i, run in enumerate(comp.runs):
                if run not in tested:
                    continue
                for j, column in enumerate(columns):
                    diff = _chart_differences(comp, run, column)
                    if diff is None:
                        continue
                    mean, se, significant = diff
                    st = style(i, run)
                    low.errorbar([j + offsets[i]], [mean], yerr=[se], linestyle="none",
                                 capsize=3, markersize=6, color=st["color"], marker="o",
                                 markerfacecolor=st["color"] if significant else "white")
            low.set_title(f"{protocol}: difference from {comp.reference} (points)", fontsize=9)
            low.set_ylabel(f"{comp.reference} = 0; above: better", fontsize=8)
        for ax in axes[:, g]:
            labels = [c.split(" ", 1)[1] if " " in c else c for c in columns]
            ax.set_xticks(range(len(columns)), labels, fontsize=8)
            ax.set_xlim(-0.6, len(columns) - 0.4)
            ax.grid(axis="y", alpha=0.3)
            ax.tick_params(axis="y", labelsize=8)
        axes[-1][g].set_xlabel(_CHART_X.get(protocol, ""), fontsize=8)
    blank = Line2D([], [], linestyle="none")
    legend = [(handles[r], name(r)) for r in comp.runs if r in handles]
    if compared:
        legend.append((blank, f"{BETTER} / {WORSE}: better / worse than {comp.reference} at "
                       f"every seed, p < {ALPHA:g} ({BETTER * 2} / {WORSE * 2}: p < 0.01); no "
                       "mark: not significant at every seed"))
    if rows == 2:
        legend.append((blank, "difference row: filled = the verdict's test is significant (p < "
                       f"{ALPHA:g}, pooled over seeds when there are several), hollow = not"))
    if comp.untested:
        legend.append((blank, "†: no paired test"))
    fig.legend([h for h, _ in legend], [t for _, t in legend], loc="outside lower center",
               ncols=1, fontsize=8, frameon=False)
    fig.suptitle(f"accuracy by run and column, tested against {comp.reference}" if compared
                 else "accuracy by column", fontsize=10)
    from e2mc.files import atomic_write

    out = Path(path)
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"))
    plt.close(fig)
    return out


#: The name of a comparison's files in their directory (``e2mc compare --out DIR``, the demo):
#: ``DIR/comparison.md``, ``.png``, ``.csv``, ``_tests.csv``.
COMPARISON_STEM = "comparison"


def comparison_paths(out_prefix: str | os.PathLike[str]) -> list[Path]:
    """The files :func:`write_comparison` writes for ``out_prefix``: ``.md``, ``.png``,
    ``.csv``, ``_tests.csv``."""
    prefix = Path(out_prefix)
    return [prefix.with_name(prefix.name + end) for end in (".md", ".png", ".csv", "_tests.csv")]


def write_comparison(comp: Comparison, out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Write ``<prefix>.md`` (the table, with the chart), ``<prefix>.png`` (the accuracy
    chart, :func:`plot_comparison`), ``<prefix>.csv`` (one row per run
    and column) and ``<prefix>_tests.csv`` (one row per paired test)."""
    from e2mc.files import atomic_write, atomic_write_text

    md, png, table, tests = comparison_paths(out_prefix)
    chart = plot_comparison(comp, png)
    atomic_write_text(md, comparison_markdown(comp)
                      + f"\n![accuracy by run and column]({chart.name})\n")

    def write_table(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["run", "column", "mean", "se", "marker", "no_paired_test"])
        for run in comp.runs:
            for c in comp.columns:
                if c in comp.cells[run]:
                    mean, se, mark = comp.cells[run][c]
                    why = ("floor" if run == comp.floor else "reference"
                           if run == comp.reference else comp.untested.get(run, {}).get(c, ""))
                    w.writerow([run, c, f"{mean:.4f}", "" if se is None else f"{se:.4f}", mark,
                                why])

    keys = ["run", "reference", "column", "seed", "difference", "n10", "n01", "mcnemar_stat",
            "mcnemar_p", "mcnemar_method", "permutation_p", "cohens_d", "ci95_low", "ci95_high"]

    def write_tests(f: Any) -> None:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for t in comp.tests:
            w.writerow({k: t[k] for k in keys})

    atomic_write(table, write_table, "w")
    atomic_write(tests, write_tests, "w")
    return [md, chart, table, tests]
