"""The comparison of evaluations (``e2mc compare``): every run against the first on the same
test images, paired tests per (column, seed) and one :class:`Verdict` per run and column
(:data:`RULE`). Its table, chart and files: :mod:`e2mc.evaluation.compare_report`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from e2mc.artifacts import EvalDir, EvalResults, mean_se
from e2mc.errors import InputError
from e2mc.evaluation.pairing import (
    check_same_test_images,
    check_value,
    correctness,
    differences,
    matched_entries,
)
from e2mc.evaluation.sanity import chance_columns, comparison_flags
from e2mc.evaluation.significance import paired_tests, pooled_permutation_test
from e2mc.files import display_name

#: Significance marks with their direction: the run is better (worse) than the reference.
BETTER, WORSE = "▲", "▼"
ALPHA = 0.05

#: The one rule of every verdict, word and mark (the table, the chart, the files, the page).
RULE = ("p: the paired permutation test over the test images, each image's difference averaged "
        "over the label-subset seeds (one seed: that seed's test); BETTER ▲ / WORSE ▼ at "
        "p < 0.05, ▲▲ / ▼▼ at p < 0.01; none where the run or the reference is at or near "
        "chance")


@dataclass(frozen=True)
class Verdict:
    """A run against the reference at one column: ``difference`` (the run's top-1 minus the
    reference's, points) and its ``se`` over the ``seeds`` matched label-subset seeds (None for
    one), ``p`` of :data:`RULE` over ``images`` test images, ``judged`` False at or near chance,
    the seeds significant alone under McNemar and the permutation test (``seeds_better``...)."""

    run: str
    column: str
    difference: float
    se: float | None
    seeds: int
    images: int
    p: float
    judged: bool = True
    seeds_better: int = 0
    seeds_worse: int = 0

    @property
    def direction(self) -> str:  # "same": no significant difference
        if not self.judged:
            return "unjudged"
        if self.p >= ALPHA or self.difference == 0:
            return "same"
        return "better" if self.difference > 0 else "worse"

    @property
    def mark(self) -> str:  # empty unless better or worse
        times = 2 if self.p < 0.01 else 1
        return {"better": BETTER * times, "worse": WORSE * times}.get(self.direction, "")

    @property
    def word(self) -> str:  # how a sentence names the direction
        return {"better": "BETTER than", "worse": "WORSE than",
                "same": "no significant difference from",
                "unjudged": "not judged (at or near chance) against"}[self.direction]

    def size(self) -> str:  # "+0.87 ± 0.50"; no ± for one seed
        return f"{self.difference:+.2f}" + (f" ± {self.se:.2f}" if self.se is not None else "")


@dataclass
class Comparison:
    """What :func:`compare_evaluations` found: ``cells[run][column] = (mean, se, mark)``, the
    mark its :class:`Verdict`'s; ``tests`` one row per (run, column, seed) paired test against
    the reference; ``verdicts`` one per tested (run, column); ``floor`` the random-init row's
    name (shown first, tested against nothing); ``untested[run][column]`` why a cell has no
    paired test; ``mismatches`` what differs between runs compared anyway (``allow_mismatch``);
    ``primaries[column]`` its cells' primary metrics (the chart's axis labels); ``flags`` what
    the verdicts rest on (:func:`e2mc.evaluation.sanity.comparison_flags`)."""

    runs: list[str]
    columns: list[str]
    cells: dict[str, dict[str, tuple[float, float | None, str]]]
    tests: list[dict[str, Any]]
    metric_note: str
    verdicts: list[Verdict]
    floor: str | None
    untested: dict[str, dict[str, str]]
    mismatches: list[str]
    primaries: dict[str, list[str]]
    flags: list[str]

    @property
    def reference(self) -> str:
        """The run every other run is tested against: the first one after the floor."""
        return next(r for r in self.runs if r != self.floor)


def compare_evaluations(eval_dirs: list[str], names: list[str] | None = None,
                 n_resamples: int = 10_000, seed: int = 0, floor: str | None = None,
                 floor_name: str = "random init", allow_mismatch: bool = False) -> Comparison:
    """Every run against the first on the same (column, seed) test predictions: the table of
    mean ± SE (each cell its run's primary metric), one :class:`Verdict` per tested (run,
    column) by :data:`RULE`, the flags. ``names`` (default :func:`evaluation_names`) are shown
    as :func:`e2mc.files.display_name` writes them. ``floor``: the evaluation of a random-init
    model, the first row ``floor_name``, tested against nothing. Runs evaluated differently
    (:func:`~e2mc.evaluation.pairing.differences`) are an ``InputError`` unless
    ``allow_mismatch`` (then listed in ``mismatches``); other test images, or a recorded top-1
    its saved predictions do not score, always are. docs/evaluation.md says it all."""
    if len(eval_dirs) < 1:
        raise ValueError("compare needs at least one run directory")
    runs = [EvalDir(d).load() for d in eval_dirs]
    # the names as every output shows them: bytes that are not UTF-8 as \xff, no controls
    names = [display_name(n) for n in (names or evaluation_names(eval_dirs))]
    floor_name = display_name(floor_name)
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} names for {len(runs)} runs")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"run names must be unique; repeated: {', '.join(repeated)}")
    if floor is not None and floor_name in names:
        raise ValueError(f"the floor's name {floor_name!r} is also a run's name")
    floor_run = EvalDir(floor).load() if floor is not None else None
    check_same_test_images([*zip(names, eval_dirs, runs, strict=True),
                             *([(floor_name, floor, floor_run)] if floor_run else [])])
    columns = list(dict.fromkeys(c for run in runs for c in run.columns()))
    others = list(zip(names[1:], runs[1:], strict=True))
    if floor_run is not None:
        others.append((floor_name, floor_run))
    differing = [(name, diffs) for name, run in others
                 if (diffs := differences(names[0], runs[0], name, run))]
    if differing and not allow_mismatch:
        name, diffs = differing[0]
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4
                                        else "")
        raise InputError(f"cannot pair {name} with {names[0]}, they were evaluated "
                         f"differently: {shown}. Pass --allow-mismatch (allow_mismatch=True) "
                         "to compare them anyway")
    mismatches = [f"{name} against {names[0]}: {'; '.join(diffs)}" for name, diffs in differing]
    base, base_chance = runs[0], chance_columns(runs[0])
    shown_runs = [*([(floor_name, floor_run)] if floor_run is not None else []),
                  *zip(names, runs, strict=True)]
    cells: dict[str, dict[str, tuple[float, float | None, str]]] = {}
    untested: dict[str, dict[str, str]] = {}
    tests: list[dict[str, Any]] = []
    verdicts: list[Verdict] = []
    for name, run in shown_runs:
        tested = run is not base and run is not floor_run
        # no verdict where the run or the reference is at or near chance
        unjudged = chance_columns(run) + base_chance if tested else []
        cells[name] = {}
        for column in columns:
            entries = run.column(column)
            if not entries:
                continue
            mean, se = mean_se([e.value for e in entries])  # each run's own primary metric
            verdict = None
            if tested:
                matched, rows = [], []
                for ref, e in matched_entries(base, run, column):
                    matched.append(correctness(base, ref, run, e))
                    for r, entry, correct in ((run, e, matched[-1][0]),
                                              (base, ref, matched[-1][1])):
                        check_value(r, entry, correct)  # the table's number is the tests'
                    rows.append(paired_tests(*matched[-1], n_resamples, seed))
                    rows[-1].update(run=name, reference=names[0], column=column, seed=e.seed)
                tests += rows
                if matched:
                    verdict = _verdict(name, column, matched, rows, n_resamples, seed,
                                       judged=column not in unjudged)
                    verdicts.append(verdict)
                else:
                    untested.setdefault(name, {})[column] = _why_untested(
                        base, run, column, names[0])
            cells[name][column] = (mean, se, verdict.mark if verdict else "")
    used: dict[str, dict[str, list[str]]] = {c: {} for c in columns}  # column: primary: runs
    for name, run in shown_runs:
        for column in columns:
            for primary in dict.fromkeys(e.primary for e in run.column(column)):
                used[column].setdefault(primary, []).append(name)
    note = "; ".join(f"{c}: " + (next(iter(u)) if len(u) == 1 else ", ".join(
        f"{p} ({', '.join(n)})" for p, n in u.items())) for c, u in used.items())
    return Comparison(runs=[n for n, _ in shown_runs], columns=columns, cells=cells,
                      tests=tests, metric_note=note, verdicts=verdicts,
                      floor=floor_name if floor is not None else None, untested=untested,
                      mismatches=mismatches, primaries={c: list(u) for c, u in used.items()},
                      flags=comparison_flags(*zip(*shown_runs, strict=True)))


def _verdict(run: str, column: str, matched: list[tuple[np.ndarray, np.ndarray]],
             rows: list[dict[str, Any]], n_resamples: int, seed: int, judged: bool) -> Verdict:
    """The :class:`Verdict` of ``run`` at ``column`` from its matched seeds' correctness and
    paired tests (:data:`RULE`: one pooled permutation test over the seeds)."""
    difference, p = pooled_permutation_test(matched, n_resamples, seed)
    _, se = mean_se([t["difference"] for t in rows])
    alone = [t for t in rows if max(t["mcnemar_p"], t["permutation_p"]) < ALPHA]
    return Verdict(run, column, 100 * difference, se, len(rows), len(matched[0][0]), p, judged,
                   seeds_better=sum(t["difference"] > 0 for t in alone),
                   seeds_worse=sum(t["difference"] < 0 for t in alone))


def _why_untested(base: EvalResults, run: EvalResults, column: str, base_name: str) -> str:
    """Why ``run``'s ``column`` has no paired test against ``base``."""
    if not base.column(column):
        return f"not evaluated by {base_name}"
    if not {e.seed for e in base.column(column)} & {e.seed for e in run.column(column)}:
        return "no common seed"
    return "no saved predictions"


def evaluation_names(eval_dirs: list[str]) -> list[str]:
    """Short unique names for evaluation directories: the folder name, with as many parent
    folders as it takes to tell them apart (``a/eval``, ``b/eval``)."""
    parts = [Path(d).resolve().parts for d in eval_dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            break
    return names
