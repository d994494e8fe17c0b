"""``results.json``: the numbers of a reproduction (tables in the paper's layout, paired tests,
the claim, the ablation, the diagnostics), collected from its run and evaluation folders, and
the thresholds its summary's rules use (declared before any run). The page is
:mod:`repro.page`, the provenance line :mod:`repro.provenance`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2mc.artifacts import RunDir
from e2mc.evaluation.runner import column_name
from repro import analysis, runs
from repro.provenance import source_commit, torch_version
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
