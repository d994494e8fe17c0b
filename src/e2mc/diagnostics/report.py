"""``diagnostics.json`` and one self-contained HTML report (figures embedded as base64 PNGs, so
the single file can be mailed or archived; the PNG files are also kept next to it)."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2mc.diagnostics.statistics import EmbeddingStatistics

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
    #: Collapse signals that fired (``e2mc.diagnostics.collapse.CollapseSignal.to_dict``).
    collapse: list[dict[str, Any]] = field(default_factory=list)
    #: The run's configuration against its base: ``(base name, [(key, base value, value)])``
    #: (:func:`e2mc.config.config_differences`); ``None`` when the file carries no
    #: configuration.
    config_diff: tuple[str, list[tuple[str, Any, Any]]] | None = None

    def to_dict(self, root: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "info": self.info,
            "collapse": list(self.collapse),
            "config_differences": None if self.config_diff is None else {
                "base": self.config_diff[0],
                "changed": {k: {"base": b, "run": v} for k, b, v in self.config_diff[1]}},
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


def _stats_table(kind: str, runs: Sequence[RunDiagnostics]) -> str:
    present = [r for r in runs if kind in r.statistics]
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in present)
    rows = []
    for key, (label, better) in STAT_ROWS.items():
        hint = f' <span class="hint">({better} is better)</span>' if better else ""
        cells = "".join(f"<td>{_fmt(getattr(r.statistics[kind], key))}</td>" for r in present)
        rows.append(f"<tr><th>{html.escape(label)}{hint}</th>{cells}</tr>")
    return (f"<h3>{html.escape(kind)}</h3><table><tr><th>statistic</th>{head}</tr>"
            + "".join(rows) + "</table>")


def _cell(value: Any) -> str:
    if isinstance(value, Mapping | list | tuple):
        return f"<code>{html.escape(json.dumps(_json_safe(value)))}</code>"
    return _fmt(value)


def _key_table(rows: Sequence[tuple[Any, ...]], head: Sequence[str]) -> str:
    """A table of ``rows`` (first cell: a key) under the column titles ``head``."""
    titles = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr><th>" + html.escape(str(r[0])) + "</th>"
                   + "".join(f"<td>{_cell(v)}</td>" for v in r[1:]) + "</tr>" for r in rows)
    return f'<table class="keys"><tr>{titles}</tr>{body}</table>'


def _runs_section(runs: Sequence[RunDiagnostics]) -> str:
    """Each run: its checkpoint and loader details as a table, and its configuration's
    differences from its base."""
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
    return f'<h2>Runs</h2><div class="runs">{"".join(parts)}</div>'


_STYLE = """
body{font-family:sans-serif;margin:1.5em;max-width:1600px}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}
th:first-child{text-align:left}.hint{color:#888;font-weight:normal;font-size:11px}
figure{display:inline-block;margin:0.5em;vertical-align:top}
img{max-width:100%}figcaption{font-size:12px;color:#444}
.runs{display:flex;flex-wrap:wrap;gap:1em}.run{border:1px solid #ddd;padding:0.5em}
.warn{color:#b00}table.keys td{text-align:left;max-width:40em;overflow-wrap:anywhere}
h4{margin:0.6em 0 0.3em;font-size:14px}
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
    each run's own figures (loss terms) appear in its column. ``extra`` goes into the JSON.
    """
    if not runs:
        raise ValueError("write_report needs at least one run")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    for _, path in [*figures, *(f for r in runs for f in r.figures)]:
        if not Path(path).is_file():
            raise ValueError(f"figure {path} does not exist")
    payload = {
        "title": title,
        "runs": [r.to_dict(root) for r in runs],
        "figures": {caption: _relative(p, root) for caption, p in figures},
        **(dict(extra) if extra else {}),
    }
    json_path = root / "diagnostics.json"
    text = json.dumps(_json_safe(payload), indent=2, allow_nan=False)
    json_path.write_text(text + "\n", encoding="utf-8")

    kinds = list(dict.fromkeys(k for r in runs for k in r.statistics))
    settings = extra.get("settings") if extra else None
    per_run = "".join(
        f'<div class="run"><h3>{html.escape(r.name)}</h3>'
        + "".join(_img(c, p, root) for c, p in r.figures) + "</div>"
        for r in runs if r.figures)
    body = [
        f"<h1>{html.escape(title)}</h1>"
        + (_key_table(sorted(settings.items()), ("setting", "value"))
           if isinstance(settings, Mapping) else ""),
        _runs_section(runs),
        "<h2>Statistics</h2>" + "".join(_stats_table(k, runs) for k in kinds),
    ]
    flagged = [(r.name, c) for r in runs for c in r.collapse]
    if flagged:
        body.insert(1, '<h2 class="warn">Possible collapse</h2><ul>' + "".join(
            f"<li><b>{html.escape(name)}</b> ({html.escape(c['kind'])} signal): "
            f"{html.escape(c['message'])}</li>" for name, c in flagged) + "</ul>")
    if figures:
        body.append("<h2>Figures</h2>" + "".join(_img(c, p, root) for c, p in figures))
    if per_run:
        body.append(f'<h2>Training curves</h2><div class="runs">{per_run}</div>')
    html_path = root / "report.html"
    html_path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n", encoding="utf-8")
    return json_path, html_path
