"""``comparison.html``, the page of ``e2mc compare`` and the demo: the headlines and their key
(:mod:`~e2mc.evaluation.compare_report`), the flags, the table, the chart beside the rules, the
caller's sections, every verdict, the per-seed tests folded. Names are escaped; the chart is
embedded (base64), so the one file can be mailed. It fits a phone (:func:`html_page`)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2mc.evaluation.compare import BETTER, WORSE, Comparison
from e2mc.evaluation.compare_report import (
    SEED_TEST_HEAD,
    TESTS_NOTE,
    cell_text,
    headline_parts,
    key_line,
    rules,
    seed_test_rows,
    tested_runs,
    verdict_sentences,
)

#: The page's file name in the comparison's directory (beside comparison.md, .png, .csv).
PAGE = "comparison.html"

#: The head of e2mc's pages (this one, the diagnostics report): a phone shows them at its own
#: width, a wide table scrolls inside its box, a number does not break across lines.
HEAD_STYLE = """
body{font-family:sans-serif;margin:1em;max-width:1200px;line-height:1.4}
h1{font-size:1.6em}ul{padding-left:1.2em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:0.5em 0 1em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:14px;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
img{max-width:100%;height:auto}summary{cursor:pointer}
.better{color:#0a6b2b;font-weight:bold}.worse{color:#b00;font-weight:bold}
.same,.unjudged,.note{color:#555}.note{font-size:13px}
"""

_STYLE = HEAD_STYLE + """
.answer{border:2px solid #888;padding:0.6em 1em;margin:0.8em 0;font-size:17px;
        background:#fafafa}
.answer li{margin:0.25em 0}
.flags{border-left:4px solid #c77700;background:#fff8ec;padding:0.3em 1em;margin:0.6em 0}
.flags li{margin:0.2em 0}
.side{display:flex;flex-wrap:wrap;gap:0 1.5em;align-items:flex-start}.side>div{flex:1 1 300px}
"""


def html_page(title: str, style: str, body: str) -> str:
    """A whole page: the viewport of a phone, ``title`` (escaped), ``style``, ``body``."""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
            f"{body}</body></html>\n")


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table that scrolls inside its box (``head``, ``rows``: cells as HTML)."""
    return ('<div class="scroll"><table><tr>' + "".join(f"<th>{h}</th>" for h in head)
            + "</tr>" + "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
            + "</table></div>")


def _e(text: Any) -> str:
    return html.escape(str(text))


def _headline(comp: Comparison, run: str) -> str:
    return "".join(f'<span class="{kind}">{_e(text)}</span>' if kind else _e(text)
                   for text, kind in headline_parts(comp, run))


def _table(comp: Comparison) -> str:
    body = []
    for run in comp.runs:
        cells = []
        for column in comp.columns:
            mark = comp.cells[run].get(column, (0, 0, ""))[2]
            kind = "better" if mark.startswith(BETTER) else "worse" if mark.startswith(
                WORSE) else ""
            cells.append(f'<td class="{kind}">' if kind else "<td>")
            cells[-1] += f"{_e(cell_text(comp, run, column))}</td>"
        role = (" (reference)" if run == comp.reference else " (floor, not tested)"
                if run == comp.floor else "")
        body.append([f"<td><b>{_e(run)}</b>{_e(role)}</td>", *cells])
    return table(["run", *(_e(c) for c in comp.columns)], body)


def _tests(comp: Comparison) -> str:
    if not comp.tests:
        return ""
    rows = [[f"<td>{_e(c)}</td>" for c in row] for row in seed_test_rows(comp)]
    return ("<h2>The tests</h2><details><summary>per-seed paired tests</summary>"
            f"<p>{_e(TESTS_NOTE)}</p>" + table([_e(h) for h in SEED_TEST_HEAD], rows)
            + "</details>")


def write_comparison_page(comp: Comparison, out_dir: str | Path,
                          chart: str | Path | None = None, *, title: str | None = None,
                          sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write the page as ``out_dir/comparison.html``; returns its path. ``chart``: the PNG of
    :func:`~e2mc.evaluation.compare_chart.plot_comparison`, embedded. ``sections``: ``(heading,
    HTML body)`` placed after the chart, the caller's own HTML (the demo's diagnostics)."""
    from e2mc.files import atomic_write_text

    title = title or f"e2mc comparison against {comp.reference}"
    body = [f"<h1>{_e(title)}</h1>"]
    if comp.verdicts:
        body.append('<div class="answer"><ul>' + "".join(
            f"<li>{_headline(comp, run)}</li>" for run in tested_runs(comp))
            + f'</ul><p class="note">{_e(key_line(comp))}</p></div>')
    else:
        body.append(f'<div class="answer">No run was tested against {_e(comp.reference)} '
                    "(one run, or no paired predictions): the table only.</div>")
    if comp.flags:  # what the verdicts rest on (e2mc.evaluation.sanity)
        body.append('<div class="flags"><ul>' + "".join(
            f"<li>&#9873; {_e(f)}</li>" for f in comp.flags) + "</ul></div>")
    body.append(_table(comp))
    body.append(f'<p class="note">{BETTER} / {WORSE}: significantly better / worse than '
                f"{_e(comp.reference)} (the same test as the verdicts); † no paired test; the "
                "rules are beside the chart.</p>")
    marks = ("<div><h2>What the marks mean</h2><ul>"
             + "".join(f"<li>{_e(r)}</li>" for r in rules(comp)) + "</ul></div>")
    if chart is not None and Path(chart).is_file():  # side by side on a wide screen
        data = base64.b64encode(Path(chart).read_bytes()).decode("ascii")
        marks = ('<h2>Accuracy and paired differences</h2><div class="side">'
                 f'<img src="data:image/png;base64,{data}" alt="{_e(Path(chart).name)}">'
                 f"{marks}</div>")
    body.append(marks)
    for heading, section in sections:
        body.append(f"<h2>{_e(heading)}</h2>{section}")
    if comp.verdicts:
        body.append("<h2>Every verdict</h2><ul>" + "".join(
            f'<li class="{v.direction}">{_e(text)}</li>'
            for v, text in zip(comp.verdicts, verdict_sentences(comp), strict=True)) + "</ul>")
    body.append(_tests(comp))
    path = Path(out_dir) / PAGE
    atomic_write_text(path, html_page(title, _STYLE, "".join(body)))
    return path
