"""``e2mc search``: trials (a grid or a list of config overrides), each paired with its control,
scored on a held-out validation split; a selection rule declared up front; ``--confirm SEEDS``
re-trains the selected setting with several seeds and tests it on the test split."""

from __future__ import annotations

import argparse
import sys

from e2mc.commands._executor import add_executor_arguments, executor_options
from e2mc.commands._run_options import add_training_arguments, training_overrides


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search",
        help="find out on validation data whether (and where) an add-on helps a model",
        description="Train every trial (the preset plus a grid point or a listed setting) and "
                    "its paired control (the same without the add-on) from the same checkpoint "
                    "and seed, score both on a held-out validation split, and select by the "
                    "declared rule: the largest positive paired difference. Resumable: finished "
                    "trials are skipped. Writes OUT/search.json, search.md and search.png.")
    parser.add_argument("--config", required=True,
                        help="preset or YAML file of the trials (with its add-on, e.g. "
                             "fmnist-swav-e2mc)")
    parser.add_argument("--from", dest="checkpoint", required=True, metavar="CHECKPOINT",
                        help="the starting checkpoint of every run")
    parser.add_argument("--data", required=True, metavar="DATA",
                        help="training data set of every run (data.dataset)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="search directory (search.json, search.md, search.png, the runs)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="a grid axis (repeatable; the trials are the product), e.g. "
                             "--grid optim.base_lr=0.001,0.01,0.1")
    parser.add_argument("--trials", metavar="YAML",
                        help="trials from a file: a list of {name, set: {key: value}} or "
                             "{grid: {key: [values]}} (no default: give --grid or --trials)")
    add_training_arguments(parser, "continue")  # as e2mc continue's, for every run
    parser.add_argument("--set", dest="common", action="append", default=[],
                        metavar="KEY=VALUE", help="override for every run (repeatable)")
    parser.add_argument("--val-split", type=float, default=0.2, metavar="FRACTION_OR_COUNT",
                        help="hold out this fraction (or number) of the training images for "
                             "validation (default: 0.2)")
    parser.add_argument("--metric", default="val/linear_1%", metavar="METRIC",
                        help="the monitor metric of the rule (default: val/linear_1%%; the "
                             "choices of e2mc continue --keep-best)")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="training seed of the trials and their controls (default: 0)")
    parser.add_argument("--confirm", metavar="SEEDS",
                        help="then train the selected setting and its control with these "
                             "training seeds (e.g. 0,1,2) and test them on the test split "
                             "(default: no confirmation)")
    parser.add_argument("--probe-epochs", type=int, default=30, metavar="N",
                        help="linear-probe epochs of the confirmation (default: 30)")
    parser.add_argument("--probe-device", default="cpu", metavar="DEVICE",
                        help="device of the confirmation's linear probes (default: cpu); the "
                             "runs train on --device")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bars of the runs, no job counts")
    add_executor_arguments(parser, "every run and evaluation")
    parser.set_defaults(func=_run, libraries=("e2mc.search", "e2mc.training.run"))


def _run(args: argparse.Namespace) -> int:
    from e2mc.search import Search, SearchPreempted, file_trials, grid_trials, make_spec
    from e2mc.training.preemption import PREEMPTED_EXIT_CODE, PreemptionHandler

    if bool(args.grid) == bool(args.trials):
        raise ValueError("give the trials with --grid (repeatable) or --trials FILE, not both")
    executor = executor_options(args)
    trials = grid_trials(args.grid) if args.grid else file_trials(args.trials)
    spec = make_spec(args.config, args.checkpoint, args.data, args.val_split, args.seed,
                     args.metric, [*args.common, *training_overrides(args)], trials)
    seeds = _seeds(args.confirm) if args.confirm else None
    search = Search(spec, args.out, executor=executor, progress=not args.quiet)
    # a pre-emption signal between runs stops the search there (exit 75, resumed when run again)
    with PreemptionHandler() as signals:
        search.stop_on(lambda: signals.requested)
        try:
            record = search.run()
            if seeds is not None:
                search.confirm(seeds, record, probe_epochs=args.probe_epochs,
                               device=args.probe_device)
        except SearchPreempted as stop:
            print(f"search pre-empted: {stop}", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
    return 0


def _seeds(text: str) -> list[int]:
    from e2mc.config.fields import check_distinct, comma_list

    try:
        seeds = comma_list(text, int)
    except ValueError:
        raise ValueError(f"--confirm takes comma-separated integer seeds, got {text!r}") from None
    check_distinct("--confirm seeds", seeds, lambda s: s >= 0,  # before the first trial runs
                   "training seeds, integers >= 0")
    return seeds
