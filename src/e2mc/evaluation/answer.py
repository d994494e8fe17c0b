"""The answer of a comparison, as the last lines a command prints (``e2mc compare``, the demo):
the flags its verdicts rest on (:mod:`e2mc.evaluation.sanity`), one headline per run tested
against the reference (every column's verdict in one line: direction, size, p-value), then
where the page is. Nothing is printed after them, so on any screen the answer is what stays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from e2mc.evaluation.compare import Comparison
from e2mc.evaluation.compare_report import UNJUDGED, difference_text, verdict_rows

__all__ = ["answer_lines", "headlines", "print_answer"]


def headlines(comp: Comparison, last: str | None = None) -> list[str]:
    """One line per run tested against the reference, its significant columns first:
    ``e2mc against continued: BETTER at linear 1% (+1.15 ± 0.29 points, pooled permutation p
    0.0081); no significant difference at linear 10% (-0.48 ± 0.16, p 0.3), knn k=20 (+0.50,
    p 0.47)``; run ``last``'s last."""
    by_run: dict[str, list[dict]] = {}
    for row in verdict_rows(comp):
        by_run.setdefault(row["run"], []).append(row)
    if last in by_run:
        by_run[last] = by_run.pop(last)
    lines = []
    for run, rows in by_run.items():
        said = []
        for row in rows:
            if row["word"].startswith(("BETTER", "WORSE")):
                said.append(f"{row['word'].split()[0]} at {row['column']} ({difference_text(row)} "
                            f"points, {row['basis']} {row['p']:.2g})")
        flat = [f"{r['column']} ({difference_text(r)}, p {r['p']:.2g})" for r in rows
                if r["word"].startswith("no significant")]
        if flat:  # with their sizes and p-values: +0.8 at p 0.06 is not -0.02 at p 1
            said.append(f"no significant difference at {', '.join(flat)}")
        unjudged = [r["column"] for r in rows if r["word"] == UNJUDGED]
        if unjudged:
            said.append(f"not judged at {', '.join(unjudged)} (at or near chance: the flag "
                        "above)")
        lines.append(f"{run} against {comp.reference}: {'; '.join(said)}")
    return lines


def answer_lines(comp: Comparison, page: str | Path | None = None, last: str | None = None,
                 notes: Sequence[str] = ()) -> list[str]:
    """The flags (``flag: ...``; the caller's ``notes`` first), the headlines (:func:`headlines`,
    ``last``'s last), and ``page: PATH``."""
    lines = [f"flag: {f}" for f in (*notes, *comp.flags)]
    lines += headlines(comp, last)
    if page is not None:
        lines.append(f"page: {page}")
    return lines


def print_answer(comp: Comparison, page: str | Path | None = None, last: str | None = None,
                 notes: Sequence[str] = (), write: Callable[[str], None] = print) -> None:
    """Print :func:`answer_lines`, set off by a blank line."""
    write("")
    for line in answer_lines(comp, page, last, notes):
        write(line)
