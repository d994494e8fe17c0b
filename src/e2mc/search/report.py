"""What a search writes for people: ``search.md`` and ``search.png`` (every trial against its
control), and the confirmation's paired tests on the test split (``confirm.json``,
``confirm.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2mc.files import display_name, markdown_text


def search_markdown(record: dict[str, Any]) -> str:
    """search.md: the rule, every trial against its control, the selection (names escaped)."""
    spec = record["spec"]
    lines = [f"# Search: {markdown_text(spec['config'])}", "",
             f"Metric `{spec['metric']}` on a validation split of {spec['val_split']:g} of the "
             f"training images (seed {spec['seed']}); the test split is never read.", "",
             f"Selection rule (declared before the first run): {spec['rule']}.", "",
             "| trial | steps | start | control | trial | difference |",
             "|---|---|---|---|---|---|"]
    for t in record["trials"]:
        if t.get("difference") is None:
            lines.append(f"| {markdown_text(t['name'])} | – | – | – | – | – |")
            continue
        mark = " **selected**" if t["name"] == record["selected"] else ""
        lines.append(f"| {markdown_text(t['name'])}{mark} | {t['steps']} | "
                     f"{t['start_value']:.2f} | {t['control_value']:.2f} | {t['value']:.2f} | "
                     f"{t['difference']:+.2f} |")
    selected = record["selected"]
    lines += ["", ("Selected: **" + markdown_text(selected) + "**." if selected else
                   "No trial beat its control: nothing is selected, and the starting model "
                   "stays the better choice."), "", "![trajectories](search.png)", ""]
    if record.get("warnings"):
        lines += ["## Warnings of the runs", ""]
        lines += [f"- {markdown_text(w['text'])} ({', '.join(map(markdown_text, w['runs']))})"
                  for w in record["warnings"]] + [""]
    return "\n".join(lines)


def control_lines(record: dict[str, Any]) -> list[tuple[list[str], list[Any]]]:
    """The distinct controls' trajectories, each once: ``(names of its trials, points)``."""
    lines: dict[tuple[tuple[float, float], ...], list[str]] = {}
    for t in record["trials"]:
        points = t.get("control_trajectory") or []
        if points:
            lines.setdefault(tuple((float(s), float(v)) for s, v in points), []).append(t["name"])
    return [(names, list(points)) for points, names in lines.items()]


def plot_trajectories(record: dict[str, Any], path: Path) -> Path:
    """The metric against steps: trials solid in colour, each distinct control dashed grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, t in enumerate(record["trials"]):
        if t["trajectory"]:
            steps, values = zip(*t["trajectory"], strict=True)
            ax.plot(steps, values, "-", color=colors[i % len(colors)], marker="o", ms=4,
                    label=display_name(t["name"]))
    controls = control_lines(record)
    for j, (names, points) in enumerate(controls):
        steps, values = zip(*points, strict=True)
        shade = str(0.15 + 0.5 * j / max(len(controls) - 1, 1))
        names = [display_name(n) for n in names]
        label = "control of " + (", ".join(names) if len(names) <= 3
                                 else f"{names[0]} and {len(names) - 1} others (the same run)")
        ax.plot(steps, values, linestyle=(0, (4, 2 + j)), color=shade, marker="s", ms=5,
                markerfacecolor="white", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(record["spec"]["metric"] + " (validation)")
    ax.set_title("trials (solid, colours) and their controls without the add-on (dashed, grey)")
    ax.grid(alpha=0.3)
    if record["trials"]:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    from e2mc.files import atomic_write

    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"))
    plt.close(fig)
    return path


def confirmation(pairs: list[tuple[int, Path, Path]], trial: str) -> dict[str, Any]:
    """Paired tests of each training seed's trial against its control on the test split per
    column, plus the permutation p pooled over every pair."""
    from e2mc.evaluation.compare import compare_evaluations
    from e2mc.evaluation.paired import pooled_p, summarize_paired_tests

    rows_by_seed: dict[int, list[dict[str, Any]]] = {}
    columns: list[str] = []
    for seed, control, run in pairs:
        comp = compare_evaluations([str(control), str(run)], names=["control", "trial"])
        rows_by_seed[seed] = comp.tests
        columns += [c for c in comp.columns if c not in columns]
    out: dict[str, Any] = {"trial": trial, "seeds": [p[0] for p in pairs], "columns": {}}
    for column in columns:
        summary = summarize_paired_tests(rows_by_seed, column)
        if summary is not None:
            summary["pooled_p"] = pooled_p([(c, r) for _, c, r in pairs], column)
            out["columns"][column] = summary
    return out


def confirm_markdown(result: dict[str, Any]) -> str:
    """confirm.md: the confirmation's paired tests per column (names escaped)."""
    lines = [f"# Confirmation of {markdown_text(result['trial'])} on the test split", "",
             f"Training seeds {', '.join(map(str, result['seeds']))}; each trained as the trial "
             "and as its control (no add-on), both evaluated on the test split.", "",
             "| column | trial − control | significantly better | significantly worse | "
             "pooled p |", "|---|---|---|---|---|"]
    for column, c in result["columns"].items():
        d = c["difference"]
        se = f" ± {d['se']:.2f}" if d["se"] is not None else ""
        pooled = f"{c['pooled_p']:.3g}" if c["pooled_p"] is not None else "–"
        lines.append(f"| {markdown_text(column)} | {d['mean']:+.2f}{se} | "
                     f"{c['significant_better']}/{c['pairs']} | "
                     f"{c['significant_worse']}/{c['pairs']} | {pooled} |")
    lines += ["", "Difference in top-1 points, mean ± SE over training seeds (each the mean over "
              "label seeds); a pair is significant when both McNemar's test and the paired "
              "permutation test give p < 0.05; pooled p: the permutation test on each test "
              "image's difference averaged over all pairs.", ""]
    return "\n".join(lines)
