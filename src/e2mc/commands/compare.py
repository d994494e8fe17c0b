"""``e2mc compare``: a Table-1-style comparison of evaluation runs with paired tests."""

from __future__ import annotations

import argparse
import sys

from e2mc.commands._types import at_least


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare evaluation runs: mean ± SE table and paired tests",
        description="Rows = runs, columns = protocol/fraction (mean ± SE over seeds). Every "
                    "run is tested against the first (McNemar + paired permutation test on the "
                    "per-image predictions of the same seed): one verdict line per run and "
                    "column first, then the table; '▲'/'▼' significantly better/worse (p<0.05 "
                    "at every seed; doubled: p<0.01); '†' no "
                    "paired test (no common seed). Runs evaluated differently (report kind, "
                    "primary metric, fractions, seeds) are refused unless --allow-mismatch.")
    p.add_argument("runs", nargs="+", help="run directories written by 'e2mc eval'")
    p.add_argument("--names", default=None, help="comma-separated row names (default: dirs)")
    p.add_argument("--out", default=None,
                   help="output prefix: writes PREFIX.md, PREFIX.csv, PREFIX_tests.csv "
                        "(default: comparison in the first run's parent directory)")
    p.add_argument("--resamples", type=at_least(1), default=10_000,
                   help="permutation / bootstrap resamples (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    p.add_argument("--floor", default=None, metavar="EVAL_DIR",
                   help="evaluation of a random-init model of the same architecture (e.g. "
                        "'e2mc eval RUN/checkpoints/epoch_0000.pt ...'): shown as the first "
                        "row, 'random init', and not tested")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare runs evaluated differently (report kind last/best, a "
                        "column's primary metric, label fractions or label seeds; refused "
                        "by default): each row shows its own metric and the table lists what "
                        "differs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from e2mc.config import comma_list
    from e2mc.evaluation.results import compare_runs, comparison_markdown, write_comparison

    names = comma_list(args.names) if args.names else None
    try:
        comp = compare_runs(args.runs, names, n_resamples=args.resamples, seed=args.seed,
                            floor=args.floor, allow_mismatch=args.allow_mismatch)
    except ValueError as exc:
        print(f"e2mc compare: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(args.runs[0]).resolve().parent / "comparison"
    paths = write_comparison(comp, out)
    print(comparison_markdown(comp, per_seed=False))  # the per-seed tests: in the files
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
