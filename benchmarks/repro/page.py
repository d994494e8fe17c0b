"""``results.md``: the page of a reproduction, written from ``results.json`` (:mod:`repro.report`):
the tables in the paper's layout, the figures and a summary written from the numbers by fixed
rules (never from a choice made after seeing them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro import analysis, figures
from repro.provenance import produced_by, public_command, public_path
from repro.report import (
    CLAIM_POINTS,
    EMBEDDING_STATS,
    FLOOR,
    PLATEAU_POINTS,
    TRANSFER,
    _label,
)
from repro.settings import ReproSettings


def write(s: ReproSettings, result: dict[str, Any], target: Path) -> Path:
    """Write ``target`` (a results page) with its figures under ``target.parent/figures``,
    named ``<target stem>_*.png`` so that several pages can share the folder."""
    fig_dir = target.parent / "figures"
    figs = _figures(s, result, fig_dir, target.stem)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markdown(s, result, {k: f"figures/{p.name}" for k, p in figs.items()}))
    return target


def _figures(s: ReproSettings, result: dict[str, Any], fig_dir: Path, prefix: str
             ) -> dict[str, Path]:
    figs: dict[str, Path] = {}
    k = min(s.knn_k)
    if any(result["base_curves"].values()):  # (a --base-run base has no epochs to plot)
        figs["base"] = figures.plot_base_curves(result["base_curves"],
                                                fig_dir / f"{prefix}_base_curves.png", k)
    if result["epoch_curves"]:
        figs["epochs"] = figures.plot_epoch_curves(
            result["epoch_curves"], fig_dir / f"{prefix}_continued_epochs.png", k,
            _label(min(s.fractions)), s.continued_epochs)
    for method, diag in result["diagnostics"].items():
        for rel in diag["figures"].values():
            name = Path(rel).stem
            if name in ("marginals", "nn_distances"):
                src = s.out / "diagnostics" / method / rel
                figs[f"diag:{method}:{name}"] = figures.copy_small(
                    src, fig_dir / f"{prefix}_{method}_{name}.png")
    return figs


def markdown(s: ReproSettings, r: dict[str, Any], figs: dict[str, str]) -> str:
    cmd = f"`{public_command(r['command'])}`"
    runs_root = s.out.parent if s.out.is_absolute() else None
    probe = ("the paper's per-method settings" if s.probe_preset == "method"
             else "generic settings")
    lines = ["# Results: the paper in miniature on Fashion-MNIST", ""]
    if r["quick"]:
        lines += ["> **Quick mode** (pipeline check on a few hundred images, 1-2 epochs): the "
                  "numbers below mean nothing about the method.", ""]
    lines += [
        f"{produced_by(r['command'], r.get('commit'), r.get('torch'))} "
        "(see `docs/reproduction.md`). "
        f"Data: `{public_path(s.data, data=True)}` "
        f"(train limit {s.train_limit}, test limit {s.test_limit}), {s.image_size} px; backbone "
        f"{f'`{s.backbone}`' if s.backbone else 'of each preset'}; base models "
        f"{s.base_epochs} epochs (seed {s.base_seed}); continued "
        f"training {s.continued_epochs} epochs at the presets' constant learning rates, training "
        f"seeds {list(s.seeds)}; linear probes {s.probe_epochs} epochs "
        f"({probe}, last-epoch top-1 on the test split, label-subset seeds {list(s.label_seeds)}); "
        f"kNN: cosine, T = 0.07. All runs and evaluations are in "
        f"`{public_path(s.out, runs_root)}`; every number is also in its `results.json`.", ""]
    lines += _table1(s, r)
    lines += _tests_table(s, r)
    lines += _ablation_table(s, r, cmd)
    lines += _figures_md(s, r, figs, cmd)
    lines += _diagnostics_table(r)
    lines += _what_it_means(s, r)
    t = r["timing_s"]
    if t:
        lines += ["", "## Time", "", "Wall-clock seconds per stage, summed over the "
                  "invocations that built this output directory: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in t.items())
                  + f" (total {sum(t.values()):.0f})."]
    return "\n".join(lines) + "\n"


def _transfer_source(s: ReproSettings, r: dict[str, Any]) -> str:
    shown = public_path(s.transfer_data, data=True) if s.transfer_data else ""
    note = r["transfer_note"]
    return note.replace(str(s.transfer_data), shown) if note and shown else note or shown


#: Readable names of the usual data folders (the transfer column is named after its data).
_DATA_NAMES = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST",
               "fashion_mnist": "Fashion-MNIST", "fashionmnist": "Fashion-MNIST",
               "builtin": "Fashion-MNIST (built-in subset)",
               "builtin:fashion-mnist": "Fashion-MNIST (built-in subset)"}


def transfer_name(s: ReproSettings) -> str:
    """The transfer data set as the table names it: ``MNIST`` for a folder ``.../mnist``, else
    the folder's (or file's) own name; ``none`` without ``--transfer-data``."""
    if not s.transfer_data:
        return "none"
    name = Path(str(s.transfer_data)).name or str(s.transfer_data)
    return _DATA_NAMES.get(name.lower(), _DATA_NAMES.get(str(s.transfer_data), name))


#: The rows of Table 3 (the paper's other regularisers, and SIGReg beside them).
OTHER_CRITERIA = frozenset({"+VCReg", "+AUH", "+MMCR", "+SIGReg"})


def _table1(s: ReproSettings, r: dict[str, Any]) -> list[str]:
    cols = r["columns"]
    head = [*cols[:-1], f"transfer ({transfer_name(s)} {TRANSFER})"]
    out = ["## Table 1: base, continued and +E2MC", "",
           "| method | model | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(head)]
    other = []
    for method, rows in r["table1"].items():
        epochs = r["base_epochs"].get(method)
        for name, cells in rows.items():
            model = (f"base ({epochs} ep)" if name == "base" else
                     f"{FLOOR} (0 ep, the floor)" if name == FLOOR else
                     f"{name} ({epochs}+{s.continued_epochs} ep)")
            line = f"| {method} | {model} | " + " | ".join(
                analysis.fmt(cells.get(c)) for c in cols) + " |"
            (other if name in OTHER_CRITERIA else out).append(line)
    out += ["", "Top-1 %, mean ± SE: over the training seeds for continued rows (each the mean "
            "over label-subset seeds), over label-subset seeds for the single base model and "
            f"the {FLOOR} row (the floor: the base's architecture and seed before its first "
            "step). "
            f"Transfer: a linear probe on the frozen features of {transfer_name(s)} "
            f"({_transfer_source(s, r)}), label seed {s.label_seeds[0]}.", ""]
    if other:
        methods = ", ".join(sorted(m for m, rows in r["table1"].items()
                                   if OTHER_CRITERIA.intersection(rows)))
        out += [f"## Table 3 ({methods}): other criteria in continued training", "",
                "| method | model | " + " | ".join(head) + " |",
                "|---|---|" + "---|" * len(head), *other, "",
                "VCReg (mu 0.1, nu 0.001), AUH uniformity (lambda 0.5, t 2), MMCR (lambda "
                "0.005, all views) with the paper's coefficients; SIGReg (LeJEPA; not in the "
                "paper) at the weight of its `fmnist-<family>-sigreg` preset (docs/method.md); "
                "same protocol as Table 1.", ""]
    return out


def _tests_table(s: ReproSettings, r: dict[str, Any]) -> list[str]:
    out = ["## Paired tests", "",
           "Difference in points (second minus first) as mean ± SE over training seeds; then "
           "how many (training seed, label seed) pairs are significantly better / worse "
           "(p < 0.05 under both McNemar and the paired permutation test, 10,000 sign flips), "
           "the range of McNemar p-values, and the pooled p: the paired permutation test on "
           "each test image's difference averaged over all those pairs (one test that uses the "
           "evidence of every pair; it treats the trained models as fixed, like McNemar).", "",
           "| method | comparison | " + " | ".join(r["columns"]) + " |",
           "|---|---|" + "---|" * len(r["columns"])]
    for method, comps in r["tests"].items():
        for name, comp in comps.items():
            out.append(f"| {method} | {name} | " + " | ".join(
                analysis.fmt_diff(comp["summary"].get(c)) for c in r["columns"]) + " |")
    return [*out, ""]


def _ablation_table(s: ReproSettings, r: dict[str, Any], cmd: str) -> list[str]:
    ab = r["ablation"]
    if not ab:
        return []
    ref = next((row for row in ab["rows"] if row["beta"] == 0 and row["gamma"] == 0), None)
    out = [f"## Table A.2: coefficients of E2MC ({ab['method']}, training seed {ab['seed']})",
           "", "| beta | gamma | (x preset) | " + " | ".join(
               f"{c} | Δ" for c in ab["columns"]) + " |",
           "|---|---|---|" + "---|---|" * len(ab["columns"])]
    for row in ab["rows"]:
        cells = []
        for c in ab["columns"]:
            cells.append(analysis.fmt(row[c]))
            if ref is not None and row[c] and ref[c]:
                cells.append(f"{row[c]['mean'] - ref[c]['mean']:+.2f}")
            else:
                cells.append("–")
        out.append(f"| {row['beta']:g} | {row['gamma']:g} | "
                   f"({row['beta_x']:g}, {row['gamma_x']:g}) | " + " | ".join(cells) + " |")
    out += ["", "(0, 0) is the continued run. Mean ± SE over label-subset seeds "
            f"{list(s.label_seeds)}; Δ against (0, 0). The pairs are the paper's Table A.2 "
            "pairs as multiples of the preset's (beta, gamma).", ""]
    return out


def _figures_md(s: ReproSettings, r: dict[str, Any], figs: dict[str, str],
                cmd: str) -> list[str]:
    if not figs:
        return []
    out = ["## Figures", ""]
    if "base" in figs:
        out += [f"![base curves]({figs['base']})", "",
                f"kNN top-1 (k={min(s.knn_k)}) of each per-epoch base checkpoint on fixed seeded "
                f"subsets ({s.curve_train} train / {s.curve_test} test images, seed 0).", ""]
    if "epochs" in figs:
        out += [f"![continued epochs]({figs['epochs']})", "",
                f"Continued training up to {s.epochs_factor}x the default "
                f"{s.continued_epochs} epochs (dotted line), training seed {s.seeds[0]}: kNN "
                f"(curve subsets) and linear {_label(min(s.fractions))} (mean over label seeds "
                f"{list(s.label_seeds)}). Epoch 0 is the base model.", ""]
    for key, rel in figs.items():
        if key.startswith("diag:"):
            _, method, name = key.split(":")
            caption = next((c for c, p in r["diagnostics"][method]["figures"].items()
                            if Path(p).stem == name), name)
            out += [f"![{method} {name}]({rel})", "",
                    f"{method}: base (named `{method}`) → continued → +E2MC (training seed "
                    f"{s.seeds[0]}): {caption}.", ""]
    return out


def _diagnostics_table(r: dict[str, Any]) -> list[str]:
    if not r["diagnostics"]:
        return []
    out = ["## Diagnostics before and after", "",
           "| method | run | vectors | " + " | ".join(EMBEDDING_STATS) + " |",
           "|---|---|---|" + "---|" * len(EMBEDDING_STATS)]
    for method, diag in r["diagnostics"].items():
        for run in diag["runs"]:
            for kind, stats in run.items():
                if kind == "name":
                    continue
                out.append(f"| {method} | {run['name']} | {kind} | " + " | ".join(
                    f"{stats[k]:.3g}" if k in stats else "–" for k in EMBEDDING_STATS) + " |")
    out += ["", "From `e2mc analyze` on a seeded sample of the test split "
            "(see `docs/diagnostics.md` for each statistic).", ""]
    return out


def _verdict(t: dict[str, Any]) -> str:
    """The package's one rule (:attr:`e2mc.evaluation.compare.Verdict.direction`): the pooled
    paired permutation test at p < 0.05, the sign of the difference saying which way; one pair:
    that pair's tests."""
    from e2mc.evaluation.compare import Verdict

    if t.get("pooled_p") is None:
        return ("better" if t["significant_better"] == t["pairs"] else
                "worse" if t["significant_worse"] == t["pairs"] else "n.s.")
    direction = Verdict("", "", t["difference"]["mean"], None, t["pairs"], 0,
                        t["pooled_p"]).direction
    return "n.s." if direction == "same" else direction


def _what_it_means(s: ReproSettings, r: dict[str, Any]) -> list[str]:
    """Sentences generated from the numbers with thresholds fixed in advance."""
    out = ["## What we measured and what it means", ""]
    for method, points in (r["base_curves"] or {}).items():
        if len(points) < 3:
            continue
        tail = points[-max(2, len(points) // 5):]
        move = tail[-1]["knn"] - tail[0]["knn"]
        state = "has plateaued" if abs(move) < PLATEAU_POINTS else "has NOT plateaued"
        out.append(f"- {method} base: kNN top-1 moved {move:+.2f} points over its last "
                   f"{tail[-1]['epoch'] - tail[0]['epoch']} epochs ({tail[0]['knn']:.2f} → "
                   f"{tail[-1]['knn']:.2f}): by the pre-declared {PLATEAU_POINTS}-point rule it "
                   f"{state}.")
    for method, comps in r["tests"].items():
        for name, comp in comps.items():
            parts = []
            for c, t in comp["summary"].items():
                if t is not None:
                    verdict = _verdict(t)
                    pooled = (f"; pooled p {t['pooled_p']:.2g}" if t.get("pooled_p") is not None
                              else "")
                    parts.append(f"{c} {t['difference']['mean']:+.2f} ({verdict}{pooled})")
            if parts:
                out.append(f"- {method}, {name}: " + "; ".join(parts) + ".")
    for method, c in r["claim"].items():
        out.append(
            f"- The paper's claim in miniature for {method} (+E2MC ≥ {CLAIM_POINTS:g} point "
            f"above continued at {c['column']}, significant at every matched pair): "
            f"{'HOLDS' if c['holds'] else 'does NOT hold'} here ({c['difference']:+.2f} points, "
            f"{c['significant_better']}/{c['pairs']} pairs significantly better"
            + (f"; pooled over the pairs p = {c['pooled_p']:.2g}" if c.get("pooled_p") is not None
               else "") + ").")
    for method, diag in r["diagnostics"].items():
        emb = [(run["name"], run.get("projector embeddings")) for run in diag["runs"]]
        emb = [(n, st) for n, st in emb if st]
        if len(emb) == 3:
            txt = ", ".join(f"{n} {st['entropy_mean']:.3f} / {st['effective_rank']:.1f}"
                            for n, st in emb)
            out.append(f"- {method} projector embeddings, marginal entropy / effective rank: "
                       f"{txt}.")
    ep = r["epoch_curves"] or {}
    for method, curves in ep.items():
        a, b = curves.get("continued") or [], curves.get("e2mc") or []
        if a and b and a[-1]["epoch"] == b[-1]["epoch"]:
            out.append(f"- {method} after {a[-1]['epoch']} continued epochs: +E2MC − continued "
                       f"= {b[-1]['knn'] - a[-1]['knn']:+.2f} (kNN), "
                       f"{b[-1]['linear'] - a[-1]['linear']:+.2f} (linear "
                       f"{_label(min(s.fractions))}), training seed {s.seeds[0]}.")
    out += ["", "Every sentence above is generated from the tables by fixed rules (thresholds "
            "declared in `benchmarks/repro/report.py` before any run); seeds and the test split "
            "were fixed before training."]
    return out


def summary_lines(r: dict[str, Any]) -> list[str]:
    """The table printed at the end of a run: Table 1 and the E2MC-vs-continued differences."""
    cols = r["columns"]
    width = max([24, *(len(c) + 2 for c in cols)])
    m = max([8, *(len(name) for name in r["table1"])]) + 1  # the method column
    lines = ["method".ljust(m) + "model".ljust(12) + "".join(c.ljust(width) for c in cols)]
    for method, rows in r["table1"].items():
        for name, cells in rows.items():
            lines.append(f"{method:<{m}}{name:<12}" + "".join(
                analysis.fmt(cells.get(c)).ljust(width) for c in cols))
    for method, comps in r["tests"].items():
        comp = comps.get("+E2MC vs continued")
        if comp:
            lines.append(f"{method:<{m}}{'E2MC-cont.':<12}" + "".join(
                (f"{t['difference']['mean']:+.2f} ({t['significant_better']}+/"
                 f"{t['significant_worse']}-/{t['pairs']})" if (t := comp["summary"].get(c))
                 else "–").ljust(width) for c in cols))
    return lines
