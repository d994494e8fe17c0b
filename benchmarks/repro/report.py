"""``results.json`` and ``results.md``: the tables in the paper's layout, the figures and a
summary written from the numbers (never from a choice made after seeing them)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir
from e2mc.evaluation.runner import column_name
from repro import analysis, figures, runs
from repro.settings import ROW_NAMES, ReproSettings
from repro.stages import base_eval_dir, eval_dir, random_eval_dir

#: The column of the transfer probe (all labels).
TRANSFER = column_name("linear", 1.0)
#: Row of the random-init floor (same architecture and seed as the base, no training).
FLOOR = "random init"

#: A claim of the paper, in miniature: E2MC beats continued at the smallest label fraction by
#: at least this many points, significant (p < 0.05, both tests) at every matched pair.
CLAIM_POINTS = 1.0
#: The base curve has plateaued when kNN top-1 moved by less than this over the last 20% of
#: epochs (declared before any run).
PLATEAU_POINTS = 0.5
EMBEDDING_STATS = ("entropy_mean", "effective_rank", "abs_corr_mean", "uniformity",
                   "nn_overlap", "saturated_fraction")


def _label(f: float) -> str:
    from e2mc.data.subsets import fraction_label

    return fraction_label(f)


def columns(s: ReproSettings) -> list[str]:
    return [column_name("linear", f) for f in s.fractions] + [column_name("knn", k=min(s.knn_k))]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def collect(s: ReproSettings, command: str, timing: dict[str, float],
            transfer_note: str) -> dict[str, Any]:
    """Everything the report shows, from the run and evaluation directories on disk."""
    cols = columns(s)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    tests: dict[str, dict[str, dict[str, Any]]] = {}
    base_epochs: dict[str, int | None] = {}
    for method in s.methods:
        rows: dict[str, dict[str, Any]] = {}
        base_main = analysis.load(base_eval_dir(s, "main", method))
        base_tr = analysis.load(base_eval_dir(s, "transfer", method))
        base_epochs[method] = _checkpoint_epoch(RunDir(runs.base_dir(s, method)).checkpoint)
        floor_main = analysis.load(random_eval_dir(s, "main", method))
        floor_tr = analysis.load(random_eval_dir(s, "transfer", method))
        if floor_main is not None:  # the floor first: what an untrained network scores
            rows[FLOOR] = {c: analysis.cell([floor_main], c) for c in cols}
            rows[FLOOR]["transfer"] = analysis.cell([floor_tr], TRANSFER) if floor_tr \
                else None
        if base_main is not None:
            rows["base"] = {c: analysis.cell([base_main], c) for c in cols}
            rows["base"]["transfer"] = analysis.cell([base_tr], TRANSFER) if base_tr \
                else None
        run_dirs = {a: [runs.continue_dir(s, method, a, t) for t in s.seeds]
                    for a in s.addons_of(method)}
        for addon, dirs in run_dirs.items():
            main = [r for d in dirs if (r := analysis.load(eval_dir(s, "main", d)))]
            tr = [r for d in dirs if (r := analysis.load(eval_dir(s, "transfer", d)))]
            if main:
                rows[ROW_NAMES[addon]] = {c: analysis.cell(main, c) for c in cols}
                rows[ROW_NAMES[addon]]["transfer"] = analysis.cell(tr, TRANSFER) \
                    if tr else None
        table[method] = rows
        tests[method] = _method_tests(s, method, cols)
    result = {
        "command": command, "commit": source_commit(), "quick": s.quick_mode,
        "torch": torch_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v)
                     for k, v in vars(s).items() if k not in ("base_runs",)},
        "base_runs": {m: str(runs.base_dir(s, m)) for m in s.methods},
        "base_epochs": base_epochs, "continued_epochs": s.continued_epochs,
        "columns": [*cols, "transfer"],
        "timing_s": timing, "transfer_note": transfer_note,
        "table1": table, "tests": tests, "claim": _claim(s, tests),
        "ablation": _ablation(s),
        "base_curves": _read_json(s.out / "curves" / "base.json"),
        "epoch_curves": _read_json(s.out / "curves" / "epochs.json"),
        "diagnostics": _diagnostics(s),
    }
    return result


def _checkpoint_epoch(path: Path) -> int | None:
    """The ``epoch`` recorded in a project checkpoint (the base model's training length)."""
    import torch

    if not path.is_file():
        return None
    try:
        epoch = torch.load(path, map_location="cpu", weights_only=True).get("epoch")
    except Exception:  # noqa: BLE001 - unreadable or foreign checkpoint: length unknown
        return None
    return int(epoch) if epoch is not None else None


def _floor_test(s: ReproSettings, method: str, cols: list[str]) -> dict[str, Any] | None:
    """The base against its random-init floor (one model each, paired per label seed)."""
    pairs = [(random_eval_dir(s, "main", method), base_eval_dir(s, "main", method))]
    pairs_tr = [(random_eval_dir(s, "transfer", method), base_eval_dir(s, "transfer", method))]
    if analysis.load(pairs[0][0]) is None or analysis.load(pairs[0][1]) is None:
        return None
    by_seed = {s.base_seed: analysis.paired_tests(*pairs[0])}
    by_seed_tr = {s.base_seed: analysis.paired_tests(*pairs_tr[0])}
    summary = {c: analysis.summarize_tests(by_seed, c) for c in cols}
    summary["transfer"] = analysis.summarize_tests(by_seed_tr, TRANSFER)
    for key, column, dirs in [*((c, c, pairs) for c in cols),
                              ("transfer", TRANSFER, pairs_tr)]:
        if summary[key] is not None:
            summary[key]["pooled_p"] = analysis.pooled_test(dirs, column)
    return {"summary": summary, "pairs": {str(s.base_seed): by_seed[s.base_seed]},
            "transfer_pairs": {str(s.base_seed): by_seed_tr[s.base_seed]}}


def _method_tests(s: ReproSettings, method: str, cols: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    floor = _floor_test(s, method, cols)
    if floor is not None:
        out[f"base vs {FLOOR}"] = floor
    comparisons = [("continued vs base", None, "none")] + [
        (f"{ROW_NAMES[a]} vs continued", "none", a) for a in s.addons_of(method) if a != "none"]
    for name, ref_addon, addon in comparisons:
        by_seed: dict[int, list[dict[str, Any]]] = {}
        by_seed_tr: dict[int, list[dict[str, Any]]] = {}
        dirs: list[tuple[Path, Path]] = []
        dirs_tr: list[tuple[Path, Path]] = []
        for t in s.seeds:
            other = runs.continue_dir(s, method, addon, t)
            if ref_addon is None:
                ref_main = base_eval_dir(s, "main", method)
                ref_tr = base_eval_dir(s, "transfer", method)
            else:
                ref = runs.continue_dir(s, method, ref_addon, t)
                ref_main, ref_tr = eval_dir(s, "main", ref), eval_dir(s, "transfer", ref)
            dirs.append((ref_main, eval_dir(s, "main", other)))
            dirs_tr.append((ref_tr, eval_dir(s, "transfer", other)))
            by_seed[t] = analysis.paired_tests(ref_main, eval_dir(s, "main", other))
            by_seed_tr[t] = analysis.paired_tests(ref_tr, eval_dir(s, "transfer", other))
        summary = {c: analysis.summarize_tests(by_seed, c) for c in cols}
        summary["transfer"] = analysis.summarize_tests(by_seed_tr, TRANSFER)
        for key, column, pairs in [*((c, c, dirs) for c in cols),
                                   ("transfer", TRANSFER, dirs_tr)]:
            if summary[key] is not None:
                summary[key]["pooled_p"] = analysis.pooled_test(pairs, column)
        out[name] = {"summary": summary,
                     "pairs": {str(t): rows for t, rows in by_seed.items()},
                     "transfer_pairs": {str(t): rows for t, rows in by_seed_tr.items()}}
    return out


def _claim(s: ReproSettings, tests: dict[str, Any]) -> dict[str, Any]:
    column = column_name("linear", min(s.fractions))
    out = {}
    for method in ("vicreg", "swav"):
        summary = tests.get(method, {}).get("+E2MC vs continued", {}).get("summary", {})
        t = summary.get(column)
        if t is None:
            continue
        holds = (t["difference"]["mean"] >= CLAIM_POINTS
                 and t["significant_better"] == t["pairs"])
        out[method] = {"column": column, "difference": t["difference"]["mean"],
                       "significant_better": t["significant_better"], "pairs": t["pairs"],
                       "pooled_p": t.get("pooled_p"), "holds": bool(holds)}
    return out


def _ablation(s: ReproSettings) -> dict[str, Any] | None:
    try:
        grid = runs.ablation_grid(s)
    except (KeyError, ValueError):
        return None
    cols = [column_name("linear", f) for f in s.ablation_fractions]
    rows = []
    for (beta, gamma), (bm, gm) in zip(grid, s.ablation_pairs, strict=True):
        rec = analysis.load(s.out / "eval" / "ablation" / f"b{beta:g}_g{gamma:g}")
        if rec is None:
            continue
        rows.append({"beta": beta, "gamma": gamma, "beta_x": bm, "gamma_x": gm,
                     **{c: analysis.cell([rec], c) for c in cols}})
    if not rows:
        return None
    return {"method": s.ablation_method, "seed": s.seeds[0], "columns": cols, "rows": rows}


def _diagnostics(s: ReproSettings) -> dict[str, Any]:
    out = {}
    for method in s.methods:
        data = _read_json(s.out / "diagnostics" / method / "diagnostics.json")
        if data is None:
            continue
        out[method] = {
            "runs": [{"name": r["name"],
                      **{kind: {k: st[k] for k in EMBEDDING_STATS if k in st}
                         for kind, st in r["statistics"].items()}} for r in data["runs"]],
            "figures": data.get("figures", {}), "settings": data.get("settings", {})}
    return out


# --------------------------------------------------------------------------- markdown
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
    if result["base_curves"]:
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


#: Options whose value is a data set: the docs show it as ``PATH/TO/<folder name>``.
DATA_OPTIONS = ("--data", "--transfer-data")


def public_path(path: str | Path, runs_root: Path | None = None, data: bool = False) -> str:
    """``path`` as the docs show it. An absolute path of this machine becomes a placeholder:
    ``PATH/TO/<name>`` for a data set, ``RUNS/<path under runs_root>`` (else ``RUNS/<name>``)
    for a run folder. Relative paths and names such as ``builtin`` are kept."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    if data:
        return f"PATH/TO/{p.name}"
    if runs_root is not None and p.is_relative_to(runs_root):
        return f"RUNS/{p.relative_to(runs_root).as_posix()}"
    return f"RUNS/{p.name}"


def public_command(command: str) -> str:
    """A recorded command line with :func:`public_path` applied to each path in it (also in
    ``--base-run METHOD=DIR``); run folders are named relative to the parent of ``--out``."""
    tokens = [part for token in shlex.split(command)  # --opt=value as --opt value
              for part in (token.split("=", 1) if token.startswith("--") else [token])]
    out = next((v for k, v in zip(tokens, tokens[1:], strict=False) if k == "--out"), None)
    runs_root = Path(out).parent if out and Path(out).is_absolute() else None
    shown, previous = [], ""
    for token in tokens:
        if token.startswith("--"):
            shown.append(token)
            previous = token
            continue
        key, sep, value = token.partition("=") if not token.startswith("/") else ("", "", token)
        data = previous in DATA_OPTIONS or key.endswith("dataset")
        shown.append(f"{key}{sep}{public_path(value, runs_root, data)}" if sep
                     else public_path(token, runs_root, data))
        previous = ""
    return shlex.join(shown)


def source_commit() -> str | None:
    """The short hash of the checkout this code runs from, with ``+changes`` when its tracked
    code (``src``, ``benchmarks``) differs from it; None outside a git checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ":/src",
                      ":/benchmarks")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+changes" if changed else commit


def torch_version() -> str:
    """The version of torch in this process (recorded beside the commit)."""
    import torch

    return str(torch.__version__)


def produced_by(command: str, commit: str | None,
                torch_version: str | None = None) -> str:
    """The page's provenance: the command, the commit and the torch version (None: not
    recorded) (tests/test_docs_provenance.py)."""
    at = f"at commit {commit}" if commit else "(commit not recorded)"
    torch = f"with torch {torch_version}" if torch_version else "(torch version not recorded)"
    return f"Produced by `{public_command(command)}` {at} {torch}"


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
        f"`{s.backbone}`; base models {s.base_epochs} epochs (seed {s.base_seed}); continued "
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
            (other if name in ("+VCReg", "+AUH", "+MMCR") else out).append(line)
    out += ["", "Top-1 %, mean ± SE: over the training seeds for continued rows (each the mean "
            "over label-subset seeds), over label-subset seeds for the single base model and "
            f"the {FLOOR} row (the floor: the base's architecture and seed before its first "
            "step). "
            f"Transfer: a linear probe on the frozen features of {transfer_name(s)} "
            f"({_transfer_source(s, r)}), label seed {s.label_seeds[0]}.", ""]
    if other:
        out += ["## Table 3 (SwAV): other criteria in continued training", "",
                "| method | model | " + " | ".join(head) + " |",
                "|---|---|" + "---|" * len(head), *other, "",
                "VCReg (mu 0.1, nu 0.001), AUH uniformity (lambda 0.5, t 2), MMCR (lambda "
                "0.005, all views) with the paper's coefficients; same protocol as Table 1.", ""]
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
                    verdict = ("better" if t["significant_better"] == t["pairs"] else
                               "worse" if t["significant_worse"] == t["pairs"] else "mixed/n.s.")
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
    lines = ["method   model       " + "".join(c.ljust(width) for c in cols)]
    for method, rows in r["table1"].items():
        for name, cells in rows.items():
            lines.append(f"{method:<9}{name:<12}" + "".join(
                analysis.fmt(cells.get(c)).ljust(width) for c in cols))
    for method, comps in r["tests"].items():
        comp = comps.get("+E2MC vs continued")
        if comp:
            lines.append(f"{method:<9}{'E2MC-cont.':<12}" + "".join(
                (f"{t['difference']['mean']:+.2f} ({t['significant_better']}+/"
                 f"{t['significant_worse']}-/{t['pairs']})" if (t := comp["summary"].get(c))
                 else "–").ljust(width) for c in cols))
    return lines
