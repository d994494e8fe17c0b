"""The accuracy chart of ``e2mc compare``: every run at every column (protocol x label
fraction), mean with standard-error bars, next to the table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from e2mc.evaluation.results import Comparison


def _groups(columns: list[str]) -> dict[str, list[str]]:
    """Columns grouped by protocol (the text before the first space: ``linear 1%`` ->
    ``linear``), in the order they first appear."""
    groups: dict[str, list[str]] = {}
    for column in columns:
        groups.setdefault(column.split(" ", 1)[0], []).append(column)
    return groups


def plot_comparison(comp: Comparison, path: str | os.PathLike[str], dpi: int = 120) -> Path:
    """One panel per protocol; within it, the columns (label fractions, k, ...) along x and one
    marker per run, offset side by side, with a bar of +- one standard error over seeds (none
    for a single seed). Runs significantly different from the reference at every seed
    (``*``/``**`` in the table) are labelled so, cells without a paired test ``†``. The y range
    follows the data, so differences of a fraction of a point stay visible."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups = _groups(comp.columns)
    widths = [max(1.6, 1.1 * len(cols)) for cols in groups.values()]
    fig, axes = plt.subplots(1, len(groups), figsize=(sum(widths) + 1.2 * len(comp.runs) ** 0.5
                                                      + 2.0, 3.8),
                             squeeze=False, gridspec_kw={"width_ratios": widths})
    n = len(comp.runs)
    offsets = [(i - (n - 1) / 2) * min(0.8 / max(n, 1), 0.2) for i in range(n)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (protocol, columns) in zip(axes[0], groups.items(), strict=True):
        for i, run in enumerate(comp.runs):
            xs, ys, es, marks = [], [], [], []
            for j, column in enumerate(columns):
                cell = comp.cells[run].get(column)
                if cell is None:
                    continue
                mean, se, mark = cell
                if column in comp.untested.get(run, {}):
                    mark = "†"  # no paired test: not "not significant"
                xs.append(j + offsets[i])
                ys.append(mean)
                es.append(se or 0.0)
                marks.append(mark)
            if not xs:
                continue
            style = {"color": "0.45", "marker": "x"} if run == comp.floor else {
                "color": colors[i % len(colors)], "marker": "o"}
            ax.errorbar(xs, ys, yerr=es, linestyle="none", capsize=3, markersize=5,
                        label=run if ax is axes[0][0] else None, **style)
            for x, y, e, mark in zip(xs, ys, es, marks, strict=True):
                if mark:
                    ax.annotate(mark, (x, y + e), ha="center", va="bottom", fontsize=9,
                                color=style["color"])
        labels = [c.split(" ", 1)[1] if " " in c else c for c in columns]
        ax.set_xticks(range(len(columns)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(columns) - 0.4)
        ax.set_title(protocol, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=8)
    axes[0][0].set_ylabel("top-1 (%), mean ± SE over seeds", fontsize=9)
    fig.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(f"top-1 by run; * p < 0.05, ** p < 0.01 against {comp.reference} at every "
                 "seed" + ("; † no paired test" if comp.untested else ""), fontsize=9)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return out
