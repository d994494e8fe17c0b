"""What ``e2mc compare`` writes and prints of a :class:`~e2mc.evaluation.compare.Comparison`:
the verdicts, the markdown table (names escaped), the accuracy chart and the files
(``comparison.md``, ``.png``, ``.csv``, ``_tests.csv``)."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from e2mc.artifacts import mean_se
from e2mc.evaluation.compare import ALPHA, BETTER, WORSE, Comparison
from e2mc.files import markdown_text


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


#: The word of a column where the run or the reference is at or near chance.
UNJUDGED = "not judged (at or near chance) against"


def verdict_rows(comp: Comparison) -> list[dict[str, Any]]:
    """One dict per (run, column) tested against the reference: ``run``, ``column``, ``word``
    (``BETTER than`` / ``WORSE than`` / ``no significant difference from``, or
    :data:`UNJUDGED` where the run or the reference is at or near chance), ``mean`` and
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
            if column in comp.unjudged.get(run, ()):
                word = UNJUDGED  # a difference from a probe at chance means nothing
            rows_out.append({"run": run, "column": column, "word": word, "mean": mean, "se": se,
                             "seeds": len(rows), "better": better, "worse": worse, "p": p,
                             "basis": basis})
    return rows_out


def difference_text(row: dict[str, Any]) -> str:
    """The paired difference of a :func:`verdict_rows` row: its mean over seeds, signed, with
    ``± se`` where there are several (``+0.87 ± 0.50``)."""
    spread = f" ± {row['se']:.2f}" if row["se"] is not None else ""
    return f"{row['mean']:+.2f}{spread}"


def verdict_numbers(row: dict[str, Any]) -> str:
    """The numbers of a :func:`verdict_rows` row, in words: ``+0.87 ± 0.50 points over 3
    label-subset seed(s); 1 significantly better, 0 worse; pooled permutation p 0.042`` (the
    seeds of a comparison are label-subset seeds of one trained model per row)."""
    return (f"{difference_text(row)} points over {row['seeds']} label-subset seed(s); "
            f"{row['better']} "
            f"significantly better, {row['worse']} worse; {row['basis']} {row['p']:.2g}")


def verdicts(comp: Comparison) -> list[str]:
    """One sentence per (run, column) tested against the reference, in words that carry the
    direction: better / worse / no significant difference, the mean difference with its SE over
    seeds, how many seeds were significantly better and worse (both tests), and the p-value the
    verdict rests on (pooled over seeds when there are two or more, else the seed's larger)."""
    return [f"{r['run']}, {r['column']}: {r['word']} {comp.reference} ({verdict_numbers(r)})"
            for r in verdict_rows(comp)]


def comparison_markdown(comp: Comparison, per_seed: bool = True) -> str:
    """The verdicts (:func:`verdicts`) first, then the Table-1-style markdown table with its
    legend, the pooled tests and (``per_seed``) the per-seed tests. Names are escaped
    (:func:`e2mc.files.markdown_text`)."""
    found = verdicts(comp)
    ref = markdown_text(comp.reference)
    lines = ([f"Verdict against {ref} (significance: McNemar and the paired "
              f"permutation test, p < {ALPHA:g}):", "",
              *[f"- {markdown_text(v)}" for v in found], ""] if found else [])
    if comp.flags:  # what the verdicts rest on (e2mc.evaluation.sanity)
        lines += ["What the verdicts rest on:", "",
                  *[f"- flag: {markdown_text(f)}" for f in comp.flags], ""]
    lines += ["| run | " + " | ".join(markdown_text(c) for c in comp.columns) + " |",
              "|---|" + "---|" * len(comp.columns)]
    for run in comp.runs:
        untested = comp.untested.get(run, {})
        lines.append(f"| {markdown_text(run)} | " + " | ".join(
            _cell_text(comp.cells[run].get(c), c in untested) for c in comp.columns) + " |")
    lines += ["", "Mean ± standard error over seeds (percent). Metrics: "
              f"{markdown_text(comp.metric_note)}.",
              f"{BETTER} better, {WORSE} worse than {ref}: p < 0.05 ({BETTER * 2} / "
              f"{WORSE * 2}: p < 0.01) at every seed under both McNemar and the paired "
              "permutation test."]
    by_reason: dict[str, list[str]] = {}
    for run, reasons in comp.untested.items():
        for column, reason in reasons.items():
            by_reason.setdefault(reason, []).append(f"{run} at {column}")
    lines += [markdown_text(f"† no paired test ({reason}): {', '.join(cells)}.")
              for reason, cells in by_reason.items()]
    lines += [markdown_text(f"Not evaluated alike, compared anyway (--allow-mismatch): {m}.")
              for m in comp.mismatches]
    if comp.floor is not None:
        lines.append(f"{markdown_text(comp.floor)}: the floor, a random-init model of the same "
                     "architecture (not tested).")
    if comp.pooled:
        lines += ["", "Pooled over seeds (each image's difference averaged over the matched "
                  "seeds, then the paired permutation test on the images):", "",
                  "| run | column | seeds | diff | permutation p |", "|---|---|---|---|---|"]
        lines += [f"| {markdown_text(t['run'])} | {markdown_text(t['column'])} | {t['seeds']} | "
                  f"{t['difference']:+.2f} | "
                  f"{t['permutation_p']:.3g} |" for t in comp.pooled]
    if comp.tests and per_seed:
        lines += ["", "| run | column | seed | diff | n10 | n01 | McNemar p | permutation p | "
                  "Cohen's d | 95% CI |", "|---|---|---|---|---|---|---|---|---|---|"]
        for t in comp.tests:
            lines.append(
                f"| {markdown_text(t['run'])} | {markdown_text(t['column'])} | {t['seed']} | "
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

