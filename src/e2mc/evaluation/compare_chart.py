"""The chart of a comparison (``comparison.png``, embedded in the page): per protocol, the runs'
values with their marks, and below them each run's paired difference from the reference, drawn
filled where its :class:`~e2mc.evaluation.compare.Verdict` is BETTER or WORSE. One column of
panels, so that it stays readable on a phone's screen."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

from e2mc.evaluation.compare import BETTER, WORSE, Comparison

#: What the x axis of a protocol's panel varies (its columns after the protocol's name).
_CHART_X = {"linear": "labels used", "linear-aug": "labels used", "finetune": "labels used",
            "knn": "neighbours k (u: majority vote, else similarity-weighted)"}
#: Points of the chart's text: large enough at a phone's width (the page shrinks the image).
_FONT = 13


def _metric(comp: Comparison, columns: list[str]) -> str:
    """The y label of a protocol's panel: what its cells' primary metrics measure."""
    primaries = {p for c in columns for p in comp.primaries.get(c, [])}
    if primaries and all(p.startswith("top1") or p == "accuracy" for p in primaries):
        return "top-1 (%)"
    if primaries == {"mAP"}:
        return "mAP (%)"
    return "primary metric (%)"


def plot_comparison(comp: Comparison, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Per protocol a panel of the runs' values (mean ± SE over seeds, the cells' marks, ``†``
    where untested) and, when runs were tested, one of each run's paired difference from the
    reference in points, filled where its verdict is BETTER or WORSE; the legend below names
    the reference and the floor and gives :data:`~e2mc.evaluation.compare.RULE` in short."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    groups: dict[str, list[str]] = {}  # the columns by protocol (``linear 1%``: ``linear``)
    for column in comp.columns:
        groups.setdefault(column.split(" ", 1)[0], []).append(column)
    verdicts = {(v.run, v.column): v for v in comp.verdicts}
    per = 2 if comp.verdicts else 1  # a panel of differences below when runs were tested
    fig, axes = plt.subplots(per * len(groups), 1, figsize=(4.8, 2.6 * per * len(groups) + 1.4),
                             squeeze=False, layout="constrained")
    n = len(comp.runs)
    offsets = [(i - (n - 1) / 2) * min(0.8 / max(n, 1), 0.2) for i in range(n)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def style(i: int, run: str) -> dict[str, Any]:
        return ({"color": "0.45", "marker": "x"} if run == comp.floor else
                {"color": colors[i % len(colors)], "marker": "o"})

    compared = any(r not in (comp.reference, comp.floor) for r in comp.runs)
    handles: dict[str, Any] = {}
    for g, (protocol, columns) in enumerate(groups.items()):
        ax = axes[per * g][0]
        one_seed = True
        for i, run in enumerate(comp.runs):
            points = []
            for j, column in enumerate(columns):
                if (cell := comp.cells[run].get(column)) is None:
                    continue
                mean, se, mark = cell
                one_seed = one_seed and se is None
                if column in comp.untested.get(run, {}):
                    mark = "†"  # no paired test: not "not significant"
                points.append((j + offsets[i], mean, se or 0.0, mark))
            if not points:
                continue
            xs, ys, es, marks = zip(*points, strict=True)
            handles[run] = ax.errorbar(xs, ys, yerr=es, linestyle="none", capsize=3,
                                       markersize=5, **style(i, run))
            for x, y, e, mark in points:
                if mark:
                    ax.annotate(mark, (x, y + e), xytext=(0, 3), textcoords="offset points",
                                ha="center", va="bottom", fontsize=_FONT,
                                color=style(i, run)["color"])
        ax.set_title(f"{protocol}: " + ("one seed" if one_seed else "mean ± SE over seeds"),
                     fontsize=_FONT)
        ax.set_ylabel(_metric(comp, columns), fontsize=_FONT)
        if per == 2:
            low = axes[per * g + 1][0]
            low.axhline(0.0, color=colors[comp.runs.index(comp.reference) % len(colors)],
                        lw=1.0, ls="--")
            for i, run in enumerate(comp.runs):
                for j, column in enumerate(columns):
                    if (v := verdicts.get((run, column))) is None:
                        continue
                    st = style(i, run)
                    low.errorbar([j + offsets[i]], [v.difference], yerr=[v.se or 0.0],
                                 linestyle="none", capsize=3, markersize=6, color=st["color"],
                                 marker="o", markerfacecolor=st["color"] if v.mark else "white")
            low.set_title(f"{protocol}: difference from {comp.reference}", fontsize=_FONT)
            low.set_ylabel("points (0: ref.)", fontsize=_FONT)
        for a in axes[per * g:per * g + per, 0]:
            ticks = [(c.partition(" ")[2] or c).replace(" uniform", " u") for c in columns]
            a.set_xticks(range(len(columns)), ticks, fontsize=_FONT - 1)  # k=20 u
            a.set_xlim(-0.6, len(columns) - 0.4)
            a.grid(axis="y", alpha=0.3)
            a.tick_params(axis="y", labelsize=_FONT - 1)
        axes[per * g + per - 1][0].set_xlabel(
            textwrap.fill(_CHART_X.get(protocol, ""), 40), fontsize=_FONT - 1)
    blank = Line2D([], [], linestyle="none")
    legend = [(handles[r], f"{r} (reference)" if r == comp.reference and compared else
               f"{r} (floor, not tested)" if r == comp.floor else r)
              for r in comp.runs if r in handles]
    if compared:  # the rule in short: the page and comparison.md give it whole
        legend.append((blank, f"{BETTER} / {WORSE}" + (", filled" if per == 2 else "")
                       + f": BETTER / WORSE than {comp.reference}, p < 0.05 ({BETTER * 2} / "
                       f"{WORSE * 2}: p < 0.01)" + ("; hollow: not" if per == 2 else "")
                       + "; p: paired permutation test over the test images, pooled over the "
                       "label-subset seeds"))
    if comp.untested:
        legend.append((blank, "†: no paired test"))
    fig.legend([h for h, _ in legend], [textwrap.fill(t, 44) for _, t in legend],
               loc="outside lower center", ncols=1, fontsize=_FONT - 1, frameon=False)
    fig.suptitle(f"tested against {comp.reference}" if compared else "accuracy by column",
                 fontsize=_FONT + 1)
    from e2mc.files import atomic_write

    out = Path(path)
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"))
    plt.close(fig)
    return out
