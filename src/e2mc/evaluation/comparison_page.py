"""``comparison.html``: the page with the answer of ``e2mc compare`` and of the demo.

It opens on the answer (which runs are significantly better or worse than the reference, and
where), then the table with its marks and their legend, the chart of the accuracies and the
paired differences, the caller's sections (the demo's diagnostics), every verdict, what each
mark means and which rule made it (pooled over seeds or per seed, and how many verdicts a
comparison of this many cells gets wrong by chance); the per-seed tests come last, folded.

Every user-given name (runs, columns, notes) is escaped: the page holds no raw HTML of theirs.
The chart is embedded (base64), so the single file can be mailed or archived.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2mc.evaluation.compare import ALPHA, BETTER, WORSE, Comparison
from e2mc.evaluation.compare_report import (
    UNJUDGED,
    difference_text,
    verdict_numbers,
    verdict_rows,
)

#: The page's file name in the comparison's directory (beside comparison.md, .png, .csv).
PAGE = "comparison.html"

_STYLE = """
body{font-family:sans-serif;margin:1.5em;max-width:1200px;line-height:1.4}
table{border-collapse:collapse;margin:0.5em 0 1em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:14px}
th:first-child,td:first-child{text-align:left}
.answer{border:2px solid #888;padding:0.6em 1em;margin:0.8em 0;font-size:17px;
        background:#fafafa}
.answer li{margin:0.25em 0}
.flags{border-left:4px solid #c77700;background:#fff8ec;padding:0.3em 1em;margin:0.6em 0}
.flags li{margin:0.2em 0}
.better{color:#0a6b2b;font-weight:bold}.worse{color:#b00;font-weight:bold}
.same,.unjudged{color:#555}.note{color:#555;font-size:13px}
img{max-width:100%}summary{cursor:pointer}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _word_class(word: str) -> str:
    return "better" if word.startswith("BETTER") else "worse" if word.startswith(
        "WORSE") else "unjudged" if word == UNJUDGED else "same"


def answer_lines(comp: Comparison) -> list[str]:
    """The page's first lines (HTML): each significant verdict in short (``e2mc BETTER than
    continued at linear 1%``, with its difference and p), and each tested run without one
    ("no significant difference from REF in any of N columns")."""
    rows = verdict_rows(comp)
    lines = []
    for run in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == run]
        found = [r for r in mine if _word_class(r["word"]) in ("better", "worse")]
        unjudged = [r["column"] for r in mine if _word_class(r["word"]) == "unjudged"]
        if unjudged:
            lines.append(f'<b>{_e(run)}</b>: <span class="same">not judged</span> at '
                         f'<b>{_e(", ".join(unjudged))}</b> (at or near chance: see the flags)')
        for r in found:
            lines.append(f'<b>{_e(run)}</b> <span class="{_word_class(r["word"])}">'
                         f'{_e(r["word"])}</span> <b>{_e(comp.reference)}</b> at '
                         f'<b>{_e(r["column"])}</b> ({difference_text(r)} points, '
                         f'{_e(r["basis"])} {r["p"]:.2g})')
        if not found and len(unjudged) < len(mine):
            lines.append(f'<b>{_e(run)}</b>: <span class="same">no significant difference '
                         f'from</span> <b>{_e(comp.reference)}</b> in any of its '
                         f'{len(mine) - len(unjudged)} tested column(s)')
    return lines


def _table(comp: Comparison) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in comp.columns)
    body = []
    for run in comp.runs:
        cells = []
        for column in comp.columns:
            cell = comp.cells[run].get(column)
            if cell is None:
                cells.append("<td>-</td>")
                continue
            mean, se, mark = cell
            text = f"{mean:.2f}" + (f" ± {se:.2f}" if se is not None else "")
            cls = "better" if mark.startswith(BETTER) else "worse" if mark.startswith(
                WORSE) else ""
            dagger = " †" if column in comp.untested.get(run, {}) else ""
            cells.append(f'<td class="{cls}">{_e(text)}{_e(mark)}{dagger}</td>' if cls
                         else f"<td>{_e(text)}{dagger}</td>")
        role = (" (reference)" if run == comp.reference else " (floor, not tested)"
                if run == comp.floor else "")
        body.append(f"<tr><td><b>{_e(run)}</b>{_e(role)}</td>{''.join(cells)}</tr>")
    return f"<table><tr><th>run</th>{head}</tr>{''.join(body)}</table>"


def _rules(comp: Comparison, n_verdicts: int) -> str:
    ref = _e(comp.reference)
    items = [
        f"Cells: mean ± standard error over label-subset seeds (percent); metrics: "
        f"{_e(comp.metric_note)}.",
        f"<b>{BETTER}</b> / <b>{WORSE}</b>: better / worse than {ref} at <i>every</i> seed "
        f"under both McNemar's test and the paired permutation test, p &lt; {ALPHA:g} "
        f"({BETTER * 2} / {WORSE * 2}: p &lt; 0.01). No mark: not significant at every seed.",
        "The verdicts (BETTER / WORSE / no significant difference) rest on one p-value per "
        "run and column: with two or more seeds the paired permutation test <i>pooled</i> over "
        "seeds (each image's difference averaged over the seeds), with one seed the larger of "
        "its McNemar and permutation p. A verdict can therefore be BETTER without a mark (the "
        "pooled test is significant, not every seed).",
        f"Multiple comparisons: {n_verdicts} verdict(s) are tested at p &lt; {ALPHA:g} each, "
        f"without correction; if nothing differed, about {n_verdicts * ALPHA:.1f} of them "
        "would come out significant by chance. Trust a difference that repeats (over seeds, "
        "over columns, on validation data) more than a single one.",
    ]
    by_reason: dict[str, list[str]] = {}
    for run, reasons in comp.untested.items():
        for column, reason in reasons.items():
            by_reason.setdefault(reason, []).append(f"{run} at {column}")
    items += [f"† no paired test ({_e(reason)}): {_e(', '.join(cells))}."
              for reason, cells in by_reason.items()]
    items += [f"Not evaluated alike, compared anyway (--allow-mismatch): {_e(m)}."
              for m in comp.mismatches]
    if comp.floor is not None:
        items.append(f"{_e(comp.floor)}: the floor, a random-init model of the same "
                     "architecture (not tested).")
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _tests(comp: Comparison) -> str:
    parts = []
    if comp.pooled:
        rows = "".join(f"<tr><td>{_e(t['run'])}</td><td>{_e(t['column'])}</td>"
                       f"<td>{t['seeds']}</td><td>{t['difference']:+.2f}</td>"
                       f"<td>{t['permutation_p']:.3g}</td></tr>" for t in comp.pooled)
        parts.append("<p>Pooled over seeds:</p><table><tr><th>run</th><th>column</th>"
                     "<th>seeds</th><th>diff</th><th>permutation p</th></tr>" + rows +
                     "</table>")
    if comp.tests:
        rows = "".join(
            f"<tr><td>{_e(t['run'])}</td><td>{_e(t['column'])}</td><td>{t['seed']}</td>"
            f"<td>{t['difference']:+.2f}</td><td>{t['n10']}</td><td>{t['n01']}</td>"
            f"<td>{t['mcnemar_p']:.3g} ({_e(t['mcnemar_method'])})</td>"
            f"<td>{t['permutation_p']:.3g}</td><td>{t['cohens_d']:.3f}</td>"
            f"<td>[{t['ci95_low']:+.2f}, {t['ci95_high']:+.2f}]</td></tr>" for t in comp.tests)
        parts.append("<p>Per seed (n10: images only the run gets right, n01: only the "
                     "reference):</p><table><tr><th>run</th><th>column</th><th>seed</th>"
                     "<th>diff</th><th>n10</th><th>n01</th><th>McNemar p</th>"
                     "<th>permutation p</th><th>Cohen's d</th><th>95% CI</th></tr>" + rows +
                     "</table>")
    if not parts:
        return ""
    return ("<h2>The tests</h2><details><summary>pooled and per-seed paired tests</summary>"
            + "".join(parts) + "</details>")


def comparison_page(comp: Comparison, chart: str | Path | None = None, *,
                    title: str | None = None,
                    sections: Sequence[tuple[str, str]] = ()) -> str:
    """The page (HTML text). ``chart``: the PNG of :func:`~e2mc.evaluation.compare_report.
    plot_comparison`, embedded. ``sections``: ``(heading, HTML body)`` placed after the chart,
    the caller's own HTML (the demo's diagnostics)."""
    rows = verdict_rows(comp)
    title = title or f"e2mc comparison against {comp.reference}"
    body = [f"<h1>{_e(title)}</h1>"]
    answer = answer_lines(comp)
    if answer:
        body.append('<div class="answer"><ul>' + "".join(f"<li>{a}</li>" for a in answer)
                    + "</ul></div>")
    else:
        body.append(f'<div class="answer">No run was tested against {_e(comp.reference)} '
                    "(one run, or no paired predictions): the table only.</div>")
    if comp.flags:  # what the verdicts rest on (e2mc.evaluation.sanity)
        body.append('<div class="flags"><ul>' + "".join(
            f"<li>&#9873; {_e(f)}</li>" for f in comp.flags) + "</ul></div>")
    body.append(_table(comp))
    body.append(f'<p class="note">{BETTER} / {WORSE}: significantly better / worse than '
                f"{_e(comp.reference)} at every seed; † no paired test; the rules are below "
                "the chart.</p>")
    if chart is not None and Path(chart).is_file():
        data = base64.b64encode(Path(chart).read_bytes()).decode("ascii")
        body.append("<h2>Accuracy and paired differences</h2>"
                    f'<img src="data:image/png;base64,{data}" alt="{_e(Path(chart).name)}">')
    for heading, section in sections:
        body.append(f"<h2>{_e(heading)}</h2>{section}")
    if rows:
        body.append("<h2>Every verdict</h2><ul>" + "".join(
            f'<li>{_e(r["run"])}, {_e(r["column"])}: <span class="{_word_class(r["word"])}">'
            f'{_e(r["word"])}</span> {_e(comp.reference)} ({_e(verdict_numbers(r))})</li>'
            for r in rows) + "</ul>")
    body.append("<h2>What the marks mean</h2>" + _rules(comp, len(rows)))
    body.append(_tests(comp))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
            + "".join(body) + "</body></html>\n")


def write_comparison_page(comp: Comparison, out_dir: str | Path,
                          chart: str | Path | None = None, *, title: str | None = None,
                          sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write :func:`comparison_page` as ``out_dir/comparison.html``; returns its path."""
    from e2mc.files import atomic_write_text

    path = Path(out_dir) / PAGE
    atomic_write_text(path, comparison_page(comp, chart, title=title, sections=sections))
    return path
