"""``e2mc eval``: evaluate a checkpoint's backbone with the paper's protocols."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2mc.commands._executor import add_executor_arguments, executor_options
from e2mc.commands._types import at_least
from e2mc.config import comma_list
from e2mc.ranges import Interval, above


def _listed(cast, what: str):
    """An argparse type: a comma-separated list of ``cast`` values (:func:`comma_list`)."""
    def parse(text: str) -> tuple:
        try:
            return tuple(comma_list(text, cast))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") \
                from exc

    return parse


_floats, _ints, _protocols = _listed(float, "numbers"), _listed(int, "integers"), _listed(str, "")


def _checked(parse, what: str, bound: Interval):
    """An argparse type: ``parse(text)``, each value in ``bound``, no value twice."""
    def check(text: str) -> tuple:
        values = parse(text)
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one {what}, got {text!r}")
        for v in values:
            if not bound.contains(v):
                raise argparse.ArgumentTypeError(f"each {what} must be {bound.text}, got {v:g}")
        if len(set(values)) != len(values):
            twice = sorted({v for v in values if values.count(v) > 1})
            raise argparse.ArgumentTypeError(f"{', '.join(f'{v:g}' for v in twice)} given "
                                             f"twice (each {what} counts once)")
        return values

    return check


def _number(text: str) -> float:
    """One number: a list is an error, not its first value taken silently."""
    values = _floats(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one number, got {text!r}")
    return values[0]


def _positive_float(text: str) -> float:
    return _checked(lambda t: (_number(t),), "value", above(0))(text)[0]


def _grid(text: str) -> tuple[float | None, tuple[tuple[bool, float], ...]]:
    """``[FRACTION:]V1,V2,...``; a value ``xM`` is M times the fraction's preset value."""
    fraction: float | None = None
    if ":" in text:
        head, text = text.split(":", 1)
        fraction = _number(head) if head.strip() else None
    values = []
    for t in comma_list(text):
        relative = t.startswith("x")
        try:
            values.append((relative, float(t[1:] if relative else t)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected [FRACTION:]V1,V2,... with numbers or "
                                             f"xMULTIPLIER, got {t!r}") from exc
    if not values:
        raise argparse.ArgumentTypeError("empty grid")
    return fraction, tuple(values)


def _subset_file(text: str) -> tuple[float, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected FRACTION=PATH, got {text!r}")
    head, path = text.split("=", 1)
    return _number(head), path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a backbone: linear probe, kNN, fine-tuning, SVM transfer",
        description="Evaluate the backbone of CHECKPOINT. Frozen-feature protocols share "
                    "cached features. Writes OUT/results.json and OUT/predictions/ (several "
                    "checkpoints: OUT/NAME/ each, and OUT/evaluations.json).")
    p.add_argument("checkpoint", nargs="+",
                   help="checkpoint file (official, project or exported), URL, builtin:NAME "
                        "or training run directory (its kept model best.pt when it has one, "
                        "else its last step); several: each evaluated alike into "
                        "OUT/<name>/ (OUT/evaluations.json names them), also as jobs "
                        "(--executor)")
    p.add_argument("--last", action="store_true",
                   help="of a run directory, the last step's checkpoint instead of the kept "
                        "model (best.pt, when the run was trained with e2mc continue --keep-best)")
    p.add_argument("--data", required=True, metavar="DATA",
                   help="dataset: 'builtin', an IDX folder, an image folder with train/ and "
                        "test/ (or val/), or an .npz file")
    p.add_argument("--test-data", default=None,
                   help="dataset spec of the test set (default: --data, split 'test'); for "
                        "transfer, give the other data set in both --data and --test-data")
    p.add_argument("--protocol", type=_protocols, default=("linear",),
                   help="comma-separated: linear, linear-aug (per-epoch augmentation, GPU), "
                        "knn, finetune, svm (default: linear)")
    p.add_argument("--fractions", type=_checked(_floats, "fraction", Interval(0, 1, low_open=True)),
                   default=(0.01, 0.1, 1.0),
                   help="label fractions in (0, 1] (default: 0.01,0.1,1)")
    p.add_argument("--seeds", type=_checked(_ints, "seed", Interval(0)), default=(0, 1, 2),
                   help="label-subset seeds, each once (default: 0,1,2)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="evaluation directory to write; with several checkpoints or "
                        "--executor local|slurm, the directory of their evaluations")
    p.add_argument("--method", default="generic",
                   choices=("vicreg", "swav", "simsiam", "generic"), metavar="METHOD",
                   help="the probes' preset of learning rates and epochs: vicreg, swav, "
                        "simsiam (the paper's) or generic (default: generic)")
    p.add_argument("--arch", default=None,
                   help="backbone architecture of a plain state dict (default: the export's "
                        "OUT.json, else the ResNet read off the shapes), or of an official "
                        "file whose keys do not give it (a MoCo v3 ViT); e2mc and other "
                        "official files record theirs: --arch is then ignored, with a warning")
    p.add_argument("--small-images", action="store_true", help="ResNet stem for 28-32 px")
    p.add_argument("--in-channels", type=at_least(1), default=None,
                   help="image channels (default: the model's first layer's)")
    p.add_argument("--image-size", type=at_least(1), default=None,
                   help="evaluation image size (default: the size the checkpoint records it "
                        "was trained at; else the size of the --data images, with a note)")
    p.add_argument("--trust-checkpoint", dest="trust", action="store_true",
                   help="allow torch.load(weights_only=False) for a trusted checkpoint")
    p.add_argument("--epochs", type=at_least(1), default=None, metavar="N",
                   help="epochs of the linear probes and fine-tuning (default: the --method "
                        "preset's)")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help="the linear probe's learning rate (default: the --method preset's)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="the linear probe's weight decay (default: the --method preset's)")
    p.add_argument("--lr-grid", type=_grid, action="append", default=[],
                   metavar="[FRACTION:]LR,...",
                   help="linear-probe learning rates to choose from on a validation part of "
                        "the training labels (never the test split); 'x3' means 3 x the "
                        "preset's lr; with 'FRACTION:' only for that fraction; repeatable")
    p.add_argument("--wd-grid", type=_grid, action="append", default=[],
                   metavar="[FRACTION:]WD,...", help="weight decays to choose from, as --lr-grid")
    p.add_argument("--val-fraction", type=float, default=0.2,
                   help="share of each labelled subset held out to choose from the grids "
                        "(stratified; default 0.2)")
    p.add_argument("--subset-file", type=_subset_file, action="append", default=[],
                   metavar="FRACTION=PATH",
                   help="the labelled subset of FRACTION from an image list (one file name per "
                        "line, SimCLR's 1percent.txt / 10percent.txt) instead of a stratified "
                        "random subset; needs an image-folder data set; repeatable")
    p.add_argument("--report", choices=("last", "best"), default="last",
                   help="which epoch's top-1 the table shows (default: last)")
    p.add_argument("--knn-k", type=_checked(_ints, "k", Interval(1)), default=(20, 200),
                   help="neighbours of the kNN classifier, comma-separated (default: 20,200)")
    p.add_argument("--knn-temperature", type=_positive_float, default=0.07,
                   help="temperature T of the weighted kNN vote exp(sim / T) (default: 0.07)")
    p.add_argument("--knn-weighting", type=_protocols, default=("weighted", "uniform"),
                   help="kNN votes: weighted (exp(sim / T)), uniform (majority); both by "
                        "default, from one neighbour search")
    p.add_argument("--svm-costs", type=_checked(_floats, "cost", above(0)), default=None,
                   help="SVM cost grid (default: the VOC07 grid of 23 values)")
    p.add_argument("--svm-folds", type=at_least(2), default=3,
                   help="cross-validation folds choosing the SVM cost (default: 3)")
    p.add_argument("--batch-size", type=at_least(1), default=256,
                   help="images per batch of the feature extraction (default: 256)")
    p.add_argument("--num-workers", type=at_least(0), default=None,
                   help="DataLoader workers (default: one per core but one, at most 8)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bfloat16 autocast for feature extraction (default: on an accelerator "
                        "only)")
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help="device of the feature extraction and the probes: cpu, cuda, cuda:1 "
                        "or auto (default: auto, cuda when there is one)")
    p.add_argument("--cache", default=None,
                   help="feature cache directory (default: $E2MC_CACHE or ~/.cache/e2mc/features)")
    p.add_argument("--no-cache", action="store_true", help="always extract features")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip unreadable images of an image folder (counted) instead of "
                        "stopping with an error that names the file")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    add_executor_arguments(p, "every checkpoint's evaluation", trains=False)
    p.set_defaults(func=run, libraries=("e2mc.evaluation.workflow",))


def run(args: argparse.Namespace) -> int:
    from e2mc.distributed import init_runtime

    executor = executor_options(args)
    if len(args.checkpoint) > 1 or executor.kind != "inline":
        return _evaluate_set(args, executor)
    return _evaluate(args, str(init_runtime(args.device).device))  # under torchrun: joins


def _options(args: argparse.Namespace, device: str) -> object:
    from e2mc.evaluation.probe_settings import relative_grid
    from e2mc.evaluation.runner import EvalOptions
    from e2mc.evaluation.svm import VOC07_COSTS

    linear_over: dict[str, object] = {}
    finetune_over: dict[str, object] = {}
    if args.epochs is not None:
        linear_over["epochs"] = finetune_over["epochs"] = args.epochs
    if args.lr is not None:
        linear_over["lr"] = args.lr
    if args.weight_decay is not None:
        linear_over["weight_decay"] = args.weight_decay
    return EvalOptions(
        protocols=args.protocol, fractions=args.fractions, seeds=args.seeds,
        method=args.method, linear_overrides=linear_over,
        finetune_overrides=finetune_over, knn_k=args.knn_k,
        knn_temperature=args.knn_temperature, knn_weightings=args.knn_weighting,
        lr_grid=relative_grid(args.lr_grid, "lr", args.method, args.fractions, **linear_over),
        wd_grid=relative_grid(args.wd_grid, "weight_decay", args.method, args.fractions,
                              **linear_over),
        val_fraction=args.val_fraction, subset_files=dict(args.subset_file),
        svm_costs=args.svm_costs or VOC07_COSTS, svm_folds=args.svm_folds,
        report=args.report, batch_size=args.batch_size, num_workers=args.num_workers,
        autocast=args.bf16, device=device, progress=not args.quiet)


def _inputs(args: argparse.Namespace) -> dict[str, object]:
    """What every evaluation of the command shares besides its options."""
    from e2mc.evaluation.workflow import EvalData, ModelSpec, default_cache_dir

    return {"data": EvalData(args.data, args.test_data, skip_corrupt=args.skip_corrupt),
            "model": ModelSpec(args.arch, args.small_images, args.in_channels, args.trust,
                               args.last),
            "image_size": args.image_size,
            "cache": None if args.no_cache else (args.cache or default_cache_dir()),
            "extra_record": {"command": sys.argv}}


def _evaluate(args: argparse.Namespace, device: str) -> int:
    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import result_lines
    from e2mc.evaluation.workflow import evaluate_checkpoint

    results = evaluate_checkpoint(args.checkpoint[0], args.out, options=_options(args, device),
                                  **_inputs(args))
    if results is None:  # not the main process
        return 0
    print(*result_lines(results), f"wrote {EvalDir(args.out).results}", sep="\n")
    return 0


def _evaluate_set(args: argparse.Namespace, executor: object) -> int:
    from e2mc.eval_set import evaluate_set
    from e2mc.evaluation.results import result_lines

    # device "auto" is resolved by each evaluation where it runs (a job: on its node)
    evaluated = evaluate_set(args.checkpoint, args.out, options=_options(args, args.device),
                             executor=executor, **_inputs(args))
    for (name, results), given in zip(evaluated.items(), args.checkpoint, strict=True):
        print(f"{name}: {given}", *result_lines(results), sep="\n")
    dirs = " ".join(str(Path(args.out) / name) for name in evaluated)
    print(f"wrote {len(evaluated)} evaluation(s) under {args.out}; compare them with:\n"
          f"  e2mc compare {dirs} --out {Path(args.out) / 'comparison'}")
    return 0
