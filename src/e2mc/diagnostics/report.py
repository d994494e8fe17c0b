"""``diagnostics.json`` and one self-contained HTML report (figures embedded as base64 PNGs, so
the single file can be mailed or archived; the PNG files are also kept next to it).

The page opens on what matters: the verdict (how each run's statistics moved from the first
run's, collapse warnings, the accuracy curve's last values), then the figures, the training
curves and the statistics tables (each row marked with the direction that is better); the
runs' checkpoints, configurations and the analysis settings come last."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2mc.diagnostics.embedding_stats import EmbeddingStatistics
from e2mc.evaluation.comparison_page import HEAD_STYLE, html_page
from e2mc.files import atomic_write_text

#: Rows of the statistics tables: field name -> (label, which direction E2MC should move it).
STAT_ROWS: dict[str, tuple[str, str]] = {
    "entropy_mean": ("marginal entropy, mean (max 0)", "higher"),
    "entropy_std": ("marginal entropy, std over dims", ""),
    "entropy_min": ("marginal entropy, min over dims", "higher"),
    "abs_corr_mean": ("|correlation| off-diagonal, mean", "lower"),
    "abs_corr_p99": ("|correlation| off-diagonal, 99th pct", "lower"),
    "constant_dims": ("constant (dead) dimensions", "lower"),
    "effective_rank": ("effective rank", "higher"),
    "uniformity": ("AUH uniformity (t=2)", "lower"),
    "saturated_fraction": ("saturated marginal values", "lower"),
    "nn_overlap": ("NN overlap: k-th NN <= median 1st NN", "lower"),
    "nn1_median": ("median 1st-NN distance", ""),
    "nnk_median": ("median k-th-NN distance", ""),
    "knn_k": ("k", ""),
    "num_samples": ("samples", ""),
    "dim": ("dimensions", ""),
    "space": ("marginal space", ""),
}


@dataclass
class RunDiagnostics:
    """What the report shows for one run: its statistics per kind of vector (e.g.
    ``"backbone features"``, ``"projector embeddings"``), free-form info, its own figures."""

    name: str
    source: str
    statistics: dict[str, EmbeddingStatistics] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    figures: list[tuple[str, Path]] = field(default_factory=list)
    #: Collapse signals that fired (``e2mc.diagnostics.collapse.CollapseSignal`` as dicts).
    collapse: list[dict[str, Any]] = field(default_factory=list)
    #: The run's configuration against its base: ``(base name, [(key, base value, value)])``
    #: (:func:`e2mc.config.config_differences`); ``None`` when the file carries no
    #: configuration.
    config_diff: tuple[str, list[tuple[str, Any, Any]]] | None = None
    #: The run's own (method's) training loss at its first and last logged step: ``{"term",
    #: "first", "first_step", "last", "last_step"}`` (:func:`loss_change`); None when not logged.
    loss_change: dict[str, Any] | None = None

    def to_dict(self, root: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "info": self.info,
            "collapse": list(self.collapse),
            "config_differences": None if self.config_diff is None else {
                "base": self.config_diff[0],
                "changed": {k: {"base": b, "run": v} for k, b, v in self.config_diff[1]}},
            "loss_change": self.loss_change,
            "statistics": {kind: s.to_dict() for kind, s in self.statistics.items()},
            "figures": {caption: _relative(p, root) for caption, p in self.figures},
        }


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _json_safe(value: Any) -> Any:
    """Non-finite floats become ``null`` so the file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


def _img(caption: str, path: Path, root: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    name = html.escape(_relative(path, root))
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{name}" title="{name}">'
            f"<figcaption>{html.escape(caption)} <code>{name}</code></figcaption></figure>")


#: A statistic within this fraction of the first run's value counts as unchanged (a statistic
#: of a sample of images moves a little between two nearly equal models).
SAME_WITHIN = 0.01


def _moved(reference: Any, value: Any, better: str) -> str:
    """``"better"``, ``"worse"`` or ``"same"`` (within :data:`SAME_WITHIN` of ``reference``):
    how ``value`` compares with ``reference`` for a statistic whose ``better`` direction is
    ``"higher"`` or ``"lower"``; ``""`` when either is not a finite number or the statistic has
    no direction."""
    numbers = [v for v in (reference, value)
               if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    if not better or len(numbers) < 2:
        return ""
    if math.isclose(value, reference, rel_tol=SAME_WITHIN, abs_tol=1e-12):
        return "same"
    return "better" if (value > reference) == (better == "higher") else "worse"


def _stats_table(kind: str, runs: Sequence[RunDiagnostics]) -> str:
    present = [r for r in runs if kind in r.statistics]
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in present)
    reference = present[0]
    rows = []
    for key, (label, better) in STAT_ROWS.items():
        mark = {"higher": "↑ higher", "lower": "↓ lower"}.get(better, "")
        cells = []
        for r in present:
            value = getattr(r.statistics[kind], key)
            moved = "" if r is reference else _moved(
                getattr(reference.statistics[kind], key), value, better)
            cls = f' class="{moved}"' if moved in ("better", "worse") else ""
            cells.append(f"<td{cls}>{_fmt(value)}</td>")
        rows.append(f'<tr class="{better or "plain"}"><th>{html.escape(label)}</th>'
                    f'<td class="dir">{mark}</td>{"".join(cells)}</tr>')
    return (f'<h3>{html.escape(kind)}</h3><div class="scroll"><table><tr><th>statistic</th>'
            f"<th>better</th>{head}</tr>" + "".join(rows) + "</table></div>")


def _verdict(runs: Sequence[RunDiagnostics], kinds: Sequence[str]) -> list[str]:
    """One sentence (HTML) per later run and kind of vector: how many of the statistics with a
    direction moved the better way from the first run's, which moved the other way (with both
    values), how many stayed within :data:`SAME_WITHIN` of it."""
    reference, lines = runs[0], []
    for run in runs[1:]:
        for kind in kinds:
            if kind not in run.statistics or kind not in reference.statistics:
                continue
            moved: dict[str, list[str]] = {"better": [], "worse": [], "same": []}
            for key, (label, better) in STAT_ROWS.items():
                a, b = (getattr(r.statistics[kind], key) for r in (reference, run))
                how = _moved(a, b, better)
                if how:
                    moved[how].append(f"{html.escape(label)} ({_fmt(a)} → {_fmt(b)})"
                                      if how == "worse" else html.escape(label))
            total = sum(len(v) for v in moved.values())
            who = (f"<b>{html.escape(run.name)}</b> against <b>{html.escape(reference.name)}"
                   f"</b>, {html.escape(kind)}: ")
            if not total:
                continue
            if len(moved["same"]) == total:
                model = run.info.get("model")
                lines.append(who + f"all {total} statistics with a direction are within "
                             f"{SAME_WITHIN:.0%} of {html.escape(reference.name)}'s (the same "
                             "model, or one that barely moved"
                             + (f"; analysed: {html.escape(str(model))})" if model else ")"))
                continue
            text = (f'<span class="better">{len(moved["better"])} of {total}</span> '
                    "statistics moved the better way"
                    + (f" ({'; '.join(moved['better'])})" if moved["better"] else ""))
            if moved["worse"]:
                text += (f'; <span class="worse">{len(moved["worse"])} the other way</span>: '
                         + "; ".join(moved["worse"]))
            if moved["same"]:
                text += (f"; {len(moved['same'])} within {SAME_WITHIN:.0%} of "
                         f"{html.escape(reference.name)}'s")
            lines.append(who + text)
    return lines



#: A run's own loss that ends this many times above (or below 1/this of) where it started is
#: pointed out in the verdict: the add-on may be buying its statistics with the method's loss.
LOSS_FACTOR = 2.0


def loss_change(terms: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                term: str = "base/loss") -> dict[str, Any] | None:
    """``{"term", "first", "first_step", "last", "last_step", "addon"}`` of ``term`` in
    ``terms`` (:func:`e2mc.diagnostics.figures.loss_terms`: ``term -> (steps, values)``;
    ``addon``: an add-on's loss was logged other than 0); None when ``term`` was logged fewer
    than twice."""
    steps, values = terms.get(term, ((), ()))
    if len(values) < 2:
        return None
    return {"term": term, "first": float(values[0]), "first_step": int(steps[0]),
            "last": float(values[-1]), "last_step": int(steps[-1]),
            "addon": any(v != 0 for v in terms.get("addon/loss", ((), ()))[1])}


def _loss_lines(runs: Sequence[RunDiagnostics]) -> list[str]:
    """One sentence (HTML) per run whose own loss was logged: how it moved during training,
    as a factor; a rise of :data:`LOSS_FACTOR` or more is marked, with what to expect of it:
    with an add-on the run minimises the method's loss plus the add-on's terms and may give up
    some of the first for the second; without one, it should not rise."""
    lines = []
    for run in runs:
        c = run.loss_change
        if not c:
            continue
        first, last = c["first"], c["last"]
        span = (f"{_fmt(first)} at step {c['first_step']} → {_fmt(last)} at step "
                f"{c['last_step']}")
        who = f"<b>{html.escape(run.name)}</b>: its method's loss (<code>" \
              f"{html.escape(c['term'])}</code>) "
        if first > 0 and last > 0 and last / first >= LOSS_FACTOR:
            lines.append(who + f'<span class="worse">rose {last / first:.1f}×</span> during '
                         f"training ({span}); " + (
                             "expected with an add-on: the run minimises the method's loss "
                             "plus the add-on's terms (E2MC: − β · entropy + γ · covariance), "
                             "and gives up some of the first for the second; whether the trade "
                             "paid is in the tested accuracies (<code>e2mc compare</code>)"
                             if c.get("addon") else
                             "not expected of a run trained on its method's loss alone: see "
                             "its training curves (loss terms, learning rate)"))
        elif first > 0 and last > 0 and first / last >= LOSS_FACTOR:
            lines.append(who + f"fell {first / last:.1f}× during training ({span})")
        else:
            lines.append(who + f"moved less than {LOSS_FACTOR:g}× during training ({span})")
    return lines


def _accuracy_line(accuracy: Any) -> str | None:
    """The last value of each run's accuracy curve (``extra["accuracy"]``), in one sentence."""
    if not isinstance(accuracy, Mapping) or not accuracy:
        return None
    parts = [f"<b>{html.escape(str(name))}</b> {curve['top1'][-1]:.2f} % (epoch "
             f"{curve['epochs'][-1]})" for name, curve in accuracy.items()
             if isinstance(curve, Mapping) and curve.get("top1")]
    return ("kNN top-1 of the last per-epoch checkpoint: " + ", ".join(parts)
            + " (on the analysed images, no significance test: <code>e2mc eval</code> and "
            "<code>e2mc compare</code> give tested accuracies)") if parts else None


def _cell(value: Any) -> str:
    if isinstance(value, Mapping | list | tuple):
        return f"<code>{html.escape(json.dumps(_json_safe(value)))}</code>"
    return _fmt(value)


def _key_table(rows: Sequence[tuple[Any, ...]], head: Sequence[str]) -> str:
    """A table of ``rows`` (first cell: a key) under the column titles ``head``."""
    titles = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr><th>" + html.escape(str(r[0])) + "</th>"
                   + "".join(f"<td>{_cell(v)}</td>" for v in r[1:]) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="keys"><tr>{titles}</tr>{body}</table></div>'


def _runs_section(runs: Sequence[RunDiagnostics]) -> str:
    """Each run: its checkpoint and loader details as a table, and its configuration's
    differences from its base; folded (``<details>``), under the names of the runs."""
    parts = []
    for r in runs:
        rows = [("checkpoint", r.source),
                *sorted((k, v) for k, v in r.info.items() if v != r.source)]
        part = f'<div class="run"><h3>{html.escape(r.name)}</h3>' + _key_table(
            rows, ("", "value"))
        if r.config_diff is not None:
            base, changed = r.config_diff
            part += f"<h4>Configuration: differences from {html.escape(base)}</h4>" + (
                _key_table(changed, ("key", base, r.name)) if changed
                else "<p>none</p>")
        parts.append(part + "</div>")
    names = ", ".join(html.escape(r.name) for r in runs)
    return (f"<h2>Runs</h2><details><summary>checkpoints, loaders and configuration "
            f"differences of {names}</summary><div class=\"runs\">{''.join(parts)}</div>"
            "</details>")


_STYLE = HEAD_STYLE + """
body{max-width:1600px}.hint{color:#888;font-weight:normal;font-size:11px}
tr>th:first-child{white-space:normal;min-width:9em}
td.dir{text-align:left;color:#555}tr.lower td.dir{color:#1a4d99}
td.better,span.better{color:#0a6b2b;font-weight:normal}td.worse,span.worse{color:#b00;
font-weight:normal}.verdict li{margin:0.3em 0}
figure{display:inline-block;margin:0.5em 0;vertical-align:top;max-width:100%}
figcaption{font-size:12px;color:#444;overflow-wrap:anywhere}
.runs{display:flex;flex-wrap:wrap;gap:1em}.run{border:1px solid #ddd;padding:0.5em;
max-width:100%;box-sizing:border-box}
.warn{color:#b00}table.keys td{text-align:left;max-width:40em;white-space:normal;
overflow-wrap:anywhere}h4{margin:0.6em 0 0.3em;font-size:14px}
"""


def write_report(
    out_dir: str | Path,
    runs: Sequence[RunDiagnostics],
    figures: Sequence[tuple[str, Path]] = (),
    *,
    title: str = "e2mc diagnostics",
    extra: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write ``out_dir/diagnostics.json`` and ``out_dir/report.html``; return both paths.

    ``figures``: ``(caption, png path)`` comparing runs (marginals, NN histograms, accuracy);
    each run's own figures (training curves) appear under its name. ``extra`` goes into the
    JSON; its ``settings`` (the analysis settings) and ``accuracy`` (``name -> {"epochs",
    "top1"}``) also into the page.
    """
    if not runs:
        raise ValueError("write_report needs at least one run")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    for _, path in [*figures, *(f for r in runs for f in r.figures)]:
        if not Path(path).is_file():
            raise ValueError(f"figure {path} does not exist")
    kinds = list(dict.fromkeys(k for r in runs for k in r.statistics))
    settings = extra.get("settings") if extra else None
    per_run = "".join(
        f'<div class="run"><h3>{html.escape(r.name)}</h3>'
        + "".join(_img(c, p, root) for c, p in r.figures) + "</div>"
        for r in runs if r.figures)
    found = _loss_lines(runs) + _verdict(runs, kinds)
    accuracy = _accuracy_line(extra.get("accuracy") if extra else None)
    if accuracy:
        found.append(accuracy)
    payload = {
        "title": title,
        "verdict": [html.unescape(re.sub(r"<[^>]+>", "", line)) for line in found],  # as text
        "runs": [r.to_dict(root) for r in runs],
        "figures": {caption: _relative(p, root) for caption, p in figures},
        **(dict(extra) if extra else {}),
    }
    json_path = root / "diagnostics.json"
    text = json.dumps(_json_safe(payload), indent=2, allow_nan=False)
    atomic_write_text(json_path, text + "\n")
    flagged = [(r.name, c) for r in runs for c in r.collapse]
    sample = (f" Statistics and figures on {_fmt(settings['num_samples'])} images of "
              f"<code>{_fmt(settings['data'])}</code> ({_fmt(settings['split'])} split)."
              if isinstance(settings, Mapping) and {"num_samples", "data", "split"} <= set(
                  settings) else "")
    intro = (f"<p>{len(runs)} run(s); the first, <b>{html.escape(runs[0].name)}</b>, is the "
             f"reference every other run is compared with.{sample}</p>")
    body = [f"<h1>{html.escape(title)}</h1>" + intro]
    if flagged:
        body.append('<h2 class="warn">Possible collapse</h2><ul>' + "".join(
            f"<li><b>{html.escape(name)}</b> ({html.escape(c['kind'])} signal): "
            f"{html.escape(c['message'])}</li>" for name, c in flagged) + "</ul>")
    if found:
        body.append('<h2>Verdict</h2><ul class="verdict">'
                    + "".join(f"<li>{line}</li>" for line in found) + "</ul><p class=\"hint\">"
                    "Statistics of one seeded sample of images, without a significance test; a "
                    f"change of less than {SAME_WITHIN:.0%} counts as none; the better "
                    "direction of each statistic is marked in the tables below.</p>")
    if figures:
        body.append("<h2>Figures</h2>" + "".join(_img(c, p, root) for c, p in figures))
    if per_run:
        body.append(f'<h2>Training curves</h2><div class="runs">{per_run}</div>')
    body.append("<h2>Statistics</h2>" + "".join(_stats_table(k, runs) for k in kinds))
    body.append(_runs_section(runs))
    if isinstance(settings, Mapping):
        body.append("<h2>Settings</h2>" + _key_table(sorted(settings.items()),
                                                     ("setting", "value")))
    html_path = root / "report.html"
    atomic_write_text(html_path, html_page(title, _STYLE, "".join(body)))
    return json_path, html_path
