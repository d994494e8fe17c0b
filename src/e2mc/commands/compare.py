"""``e2mc compare``: a Table-1-style comparison of evaluation runs with paired tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2mc.commands._types import at_least


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare evaluation runs: mean ± SE table and paired tests",
        description="Rows = runs, columns = protocol/fraction (mean ± SE over seeds). Every "
                    "run is tested against the first (McNemar + paired permutation test on the "
                    "per-image predictions of the same seed). It prints the answer, a headline "
                    "per run, and writes the table and every verdict to --out; one test, the "
                    "paired permutation test pooled over the seeds, gives each verdict "
                    "(BETTER/WORSE at p<0.05) and its mark ('▲'/'▼'; doubled: p<0.01); '†' no "
                    "paired test (no common seed). Runs evaluated differently (the probes' "
                    "training images or labels, report kind, primary metric, fractions, seeds) "
                    "are refused unless --allow-mismatch.")
    p.add_argument("runs", nargs="+", help="run directories written by 'e2mc eval'")
    p.add_argument("--names", default=None, metavar="A,B,...",
                   help="comma-separated row names, one per run (default: their directory "
                        "names)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="directory of the comparison's files: comparison.html (the page: "
                        "verdicts, table, chart, rules), comparison.md (verdicts, table, "
                        "per-seed tests), comparison.png (chart), comparison.csv, "
                        "comparison_tests.csv (default: the first run's parent directory)")
    p.add_argument("--resamples", type=at_least(1), default=10_000, metavar="N",
                   help="permutation / bootstrap resamples (default: 10000)")
    p.add_argument("--resample-seed", type=int, default=0, metavar="N",
                   help="seed of the permutation and bootstrap resampling (default: 0)")
    p.add_argument("--floor", default=None, metavar="EVAL_DIR",
                   help="evaluation of a random-init model of the same architecture (e.g. "
                        "'e2mc eval RUN/checkpoints/epoch_0000.pt ...'): shown as the first "
                        "row, 'random init', and not tested (default: no floor row)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare runs evaluated differently (the probes' training images "
                        "or labels, report kind last/best, a column's primary metric, label "
                        "fractions or label seeds; refused "
                        "by default): each row shows its own metric and the table lists what "
                        "differs")
    p.set_defaults(func=run, libraries=("e2mc.evaluation.comparison_page",))


def run(args: argparse.Namespace) -> int:
    from e2mc.config import comma_list
    from e2mc.evaluation.compare import compare_evaluations
    from e2mc.evaluation.compare_report import COMPARISON_STEM, print_answer, write_comparison
    from e2mc.evaluation.comparison_page import write_comparison_page
    from e2mc.files import display_name

    names = comma_list(args.names) if args.names else None
    if args.out is not None:
        _check_out_dir(Path(args.out))
    comp = compare_evaluations(args.runs, names, n_resamples=args.resamples,
                               seed=args.resample_seed, floor=args.floor,
                               allow_mismatch=args.allow_mismatch)  # errors: e2mc.cli's path
    out = Path(args.out) if args.out is not None else Path(args.runs[0]).resolve().parent
    paths = write_comparison(comp, out / COMPARISON_STEM)
    page = write_comparison_page(comp, out, chart=paths[1])
    # the answer, on one screen: where the files are, the flags, a headline per run, the page
    # (a directory whose name is not UTF-8 shown with \xff, never a UnicodeEncodeError)
    print_answer(comp, display_name(page), files=display_name(paths[0]),
                 also=" (beside it: .png, .csv, _tests.csv)")
    return 0


def _check_out_dir(out: Path) -> None:
    """``--out`` is a directory (it was a file prefix): a file there, or a stale comparison
    written with the old prefix beside it, is refused saying what changed."""
    from e2mc.errors import InputError
    from e2mc.evaluation.compare_report import COMPARISON_STEM, comparison_paths

    changed = ("compare --out is a directory now (it was a file prefix): the files are "
               f"{out / COMPARISON_STEM}.md, .png, .csv and _tests.csv")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; {changed}")
    stale = [p for p in comparison_paths(out) if p.exists()]
    if stale:
        raise InputError(f"{changed}; {stale[0]} beside it is a comparison written with --out "
                         "as a prefix, which this run would not update: remove "
                         f"{', '.join(p.name for p in stale)} or give another --out")
