"""What ``e2mc compare`` and the demo say of a :class:`~e2mc.evaluation.compare.Comparison`:
a headline per run and its key (the same words in the terminal, ``comparison.md`` and the page),
every verdict in a sentence, the answer printed last, the files (``comparison.md``, ``.png``,
``.csv``, ``_tests.csv``)."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2mc.evaluation.compare import ALPHA, BETTER, RULE, WORSE, Comparison, Verdict
from e2mc.files import markdown_text

__all__ = ["comparison_markdown", "headline_parts", "headlines", "key_line",
           "print_answer", "verdict_sentence", "verdict_sentences", "write_comparison"]


def cell_text(comp: Comparison, run: str, column: str) -> str:
    """A cell of the table: ``mean ± se`` with its verdict's mark, `` †`` where untested."""
    if (cell := comp.cells[run].get(column)) is None:
        return "-"
    mean, se, mark = cell
    return (f"{mean:.2f}" + (f" ± {se:.2f}" if se is not None else "") + mark
            + (" †" if column in comp.untested.get(run, {}) else ""))


#: The columns of the per-seed tests (:func:`seed_test_rows`).
SEED_TEST_HEAD = ("run", "column", "seed", "diff", "n10", "n01", "McNemar p", "permutation p",
             "Cohen's d", "95% CI")


def seed_test_rows(comp: Comparison) -> list[list[str]]:
    """The per-seed paired tests as text, one row each (:data:`SEED_TEST_HEAD`)."""
    return [[t["run"], t["column"], str(t["seed"]), f"{t['difference']:+.2f}", str(t["n10"]),
             str(t["n01"]), f"{t['mcnemar_p']:.3g} ({t['mcnemar_method']})",
             f"{t['permutation_p']:.3g}", f"{t['cohens_d']:.3f}",
             f"[{t['ci95_low']:+.2f}, {t['ci95_high']:+.2f}]"] for t in comp.tests]


#: What the per-seed tests' n10 and n01 count.
TESTS_NOTE = "Per seed (n10: images only the run gets right, n01: only the reference):"


def verdict_sentence(v: Verdict, reference: str) -> str:
    """``e2mc, linear 1%: BETTER than continued ▲▲ (+1.15 ± 0.29 points over 3 label-subset
    seed(s), p 0.0081; significant alone at 1 seed(s) better, 0 worse)``."""
    return (f"{v.run}, {v.column}: {v.word} {reference}{' ' + v.mark if v.mark else ''} "
            f"({v.size()} points over {v.seeds} label-subset seed(s), p {v.p:.2g}; significant "
            f"alone at {v.seeds_better} seed(s) better, {v.seeds_worse} worse)")


def verdict_sentences(comp: Comparison) -> list[str]:
    """:func:`verdict_sentence` of every verdict, in the order of the runs and columns."""
    return [verdict_sentence(v, comp.reference) for v in comp.verdicts]


def headline_parts(comp: Comparison, run: str) -> list[tuple[str, str]]:
    """The headline of ``run`` as ``(text, kind)`` pieces, ``kind`` a verdict's direction
    (``better``, ``worse``, ``unjudged``) or ``""``: ``e2mc against continued: BETTER at linear
    1% ▲▲ (+1.15 ± 0.29, p 0.0081); no significant difference at linear 10% (-0.48 ± 0.16, p
    0.3), knn k=20 (+0.50, p 0.47)``, significant columns first. The terminal and
    ``comparison.md`` join the texts; the page colours the kinds."""
    mine = [v for v in comp.verdicts if v.run == run]
    said: list[list[tuple[str, str]]] = []
    for direction, word in (("better", "BETTER"), ("worse", "WORSE"), ("same", "")):
        group: list[tuple[str, str]] = []
        for v in (v for v in mine if v.direction == direction):
            group += [(", " if group else "", ""), (v.column, "")]
            group += [(" ", ""), (v.mark, direction)] if v.mark else []
            group.append((f" ({v.size()}, p {v.p:.2g})", ""))  # sizes and p: +0.8 at p 0.06
        if group:  # is not -0.02 at p 1
            said.append([(word, direction), (" at ", "")] + group if word else
                        [("no significant difference at ", "")] + group)
    unjudged = [v.column for v in mine if v.direction == "unjudged"]
    if unjudged:
        said.append([(f"not judged at {', '.join(unjudged)} (at or near chance: the flag "
                      "above)", "unjudged")])
    parts: list[tuple[str, str]] = [(f"{run} against {comp.reference}: ", "")]
    for i, pieces in enumerate(said or [[("no paired test (†)", "")]]):
        parts += ([("; ", "")] if i else []) + pieces
    return [(text, kind) for text, kind in parts if text]


def tested_runs(comp: Comparison, last: str | None = None) -> list[str]:
    """The runs tested against the reference (or with a cell that could not be), ``last``'s
    last."""
    runs = [r for r in comp.runs if r not in (comp.reference, comp.floor)
            and (any(v.run == r for v in comp.verdicts) or r in comp.untested)]
    return [*(r for r in runs if r != last), *(r for r in runs if r == last)]


def headlines(comp: Comparison, last: str | None = None) -> list[str]:
    """One line per tested run (:func:`headline_parts`, :func:`tested_runs`)."""
    return ["".join(t for t, _ in headline_parts(comp, r)) for r in tested_runs(comp, last)]


def key_line(comp: Comparison) -> str:
    """What the numbers of the headlines are: the difference, what its ± and its p are taken
    over, the marks."""
    spreads = sorted({v.seeds for v in comp.verdicts if v.seeds > 1})
    images = " or ".join(map(str, sorted({v.images for v in comp.verdicts})))
    spread = (f" ± over {' or '.join(map(str, spreads))} label-subset seeds (the probes' "
              "labelled images; not training seeds)" if spreads else " (one seed, no ±)")
    return (f"key: difference from {comp.reference} in top-1 points{spread}; p: paired "
            f"permutation test over {images} test images"
            + (", pooled over the seeds" if spreads else "")
            + f"; {BETTER} {WORSE} p < {ALPHA:g}, {BETTER * 2} {WORSE * 2} p < 0.01")


def print_answer(comp: Comparison, page: str | Path | None = None, *,
                 files: str | Path | None = None, also: str = "", last: str | None = None,
                 notes: Sequence[str] = ()) -> None:
    """Print the answer, set off by a blank line, nothing after it (on any screen it is what
    stays): where the files are (``files``: the comparison.md, and ``also``), each flag once
    (the caller's ``notes`` first), the key and the headlines (:func:`key_line`,
    :func:`headlines`, ``last``'s last), ``page: PATH``."""
    lines = ["", *([f"files: the table, every verdict and the paired tests in {files}{also}"]
                   if files is not None else [])]
    lines += [f"flag: {f}" for f in dict.fromkeys([*notes, *comp.flags])]
    lines += [f"Not evaluated alike, compared anyway (--allow-mismatch): {m}."
              for m in comp.mismatches]
    if comp.verdicts:
        lines.append(key_line(comp))
    lines += headlines(comp, last)
    if page is not None:
        lines.append(f"page: {page}")
    print(*lines, sep="\n")


def rules(comp: Comparison) -> list[str]:
    """The legend of the table (plain text): the cells, the marks' rule (:data:`RULE`), the
    cells without a paired test, what was compared anyway, the floor."""
    out = [f"Cells: mean ± standard error over label-subset seeds (percent); metrics: "
           f"{comp.metric_note}.",
           f"Verdicts and marks against {comp.reference}: {RULE}."]
    by_reason: dict[str, list[str]] = {}
    for run, reasons in comp.untested.items():
        for column, reason in reasons.items():
            by_reason.setdefault(reason, []).append(f"{run} at {column}")
    out += [f"† no paired test ({reason}): {', '.join(cells)}."
            for reason, cells in by_reason.items()]
    out += [f"Not evaluated alike, compared anyway (--allow-mismatch): {m}."
            for m in comp.mismatches]
    if comp.floor is not None:
        out.append(f"{comp.floor}: the floor, a random-init model of the same architecture "
                   "(not tested).")
    if comp.verdicts:
        n = len(comp.verdicts)
        out.append(f"Multiple comparisons: {n} verdict(s) at p < {ALPHA:g} each, without "
                   f"correction; if nothing differed, about {n * ALPHA:.1f} of them would come "
                   "out significant by chance. Trust a difference that repeats (over seeds, "
                   "columns, validation data) more than a single one.")
    return out


def comparison_markdown(comp: Comparison) -> str:
    """The headlines and their key first, the flags, the Table-1-style table with its legend
    (:func:`rules`), every verdict and the per-seed tests. Names are escaped
    (:func:`e2mc.files.markdown_text`)."""
    lines = []
    if comp.verdicts:
        lines += [f"Verdict against {markdown_text(comp.reference)}:", "",
                  *[f"- {markdown_text(h)}" for h in headlines(comp)], "",
                  markdown_text(key_line(comp)), ""]
    if comp.flags:  # what the verdicts rest on (e2mc.evaluation.sanity)
        lines += ["What the verdicts rest on:", "",
                  *[f"- flag: {markdown_text(f)}" for f in comp.flags], ""]
    lines += ["| run | " + " | ".join(markdown_text(c) for c in comp.columns) + " |",
              "|---|" + "---|" * len(comp.columns)]
    lines += [f"| {markdown_text(run)} | " + " | ".join(cell_text(comp, run, c)
                                                         for c in comp.columns) + " |"
              for run in comp.runs]
    lines += ["", *[markdown_text(r) for r in rules(comp)]]
    if comp.verdicts:
        lines += ["", "Every verdict:", "",
                  *[f"- {markdown_text(v)}" for v in verdict_sentences(comp)]]
    if comp.tests:
        lines += ["", TESTS_NOTE, "", f"| {' | '.join(SEED_TEST_HEAD)} |",
                  "|" + "---|" * len(SEED_TEST_HEAD)]
        lines += [f"| {' | '.join(markdown_text(c) for c in row)} |"
                  for row in seed_test_rows(comp)]
    return "\n".join(lines) + "\n"


#: The name of a comparison's files in their directory (``e2mc compare --out DIR``, the demo):
#: ``DIR/comparison.md``, ``.png``, ``.csv``, ``_tests.csv``.
COMPARISON_STEM = "comparison"


def comparison_paths(out_prefix: str | os.PathLike[str]) -> list[Path]:
    """The files :func:`write_comparison` writes for ``out_prefix``: ``.md``, ``.png``,
    ``.csv``, ``_tests.csv``."""
    prefix = Path(out_prefix)
    return [prefix.with_name(prefix.name + end) for end in (".md", ".png", ".csv", "_tests.csv")]


def write_comparison(comp: Comparison, out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Write ``<prefix>.md`` (:func:`comparison_markdown`, with the chart), ``<prefix>.png``
    (the chart, :func:`~e2mc.evaluation.compare_chart.plot_comparison`), ``<prefix>.csv`` (one
    row per run and column: its cell, its verdict's direction and p) and ``<prefix>_tests.csv``
    (one row per paired test)."""
    from e2mc.files import atomic_write, atomic_write_text

    md, png, table, tests = comparison_paths(out_prefix)
    from e2mc.evaluation.compare_chart import plot_comparison

    chart = plot_comparison(comp, png)
    atomic_write_text(md, comparison_markdown(comp)
                      + f"\n![accuracy by run and column]({chart.name})\n")

    verdicts = {(v.run, v.column): v for v in comp.verdicts}

    def write_table(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["run", "column", "mean", "se", "marker", "verdict", "p", "no_paired_test"])
        for run in comp.runs:
            for c in (c for c in comp.columns if c in comp.cells[run]):
                mean, se, mark = comp.cells[run][c]
                v = verdicts.get((run, c))
                why = ("floor" if run == comp.floor else "reference"
                       if run == comp.reference else comp.untested.get(run, {}).get(c, ""))
                w.writerow([run, c, f"{mean:.4f}", "" if se is None else f"{se:.4f}", mark,
                            v.direction if v else "", f"{v.p:.4g}" if v else "", why])

    keys = ["run", "reference", "column", "seed", "difference", "n10", "n01", "mcnemar_stat",
            "mcnemar_p", "mcnemar_method", "permutation_p", "cohens_d", "ci95_low", "ci95_high"]

    def write_tests(f: Any) -> None:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(comp.tests)

    atomic_write(table, write_table, "w")
    atomic_write(tests, write_tests, "w")
    return [md, chart, table, tests]

