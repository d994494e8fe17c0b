"""``e2mc analyze``: embedding statistics, the paper's diagnostic figures and an HTML report."""

from __future__ import annotations

import argparse

from e2mc.commands._types import at_least


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="embedding statistics, 2-D marginals, NN-distance histograms and a report",
        description=(
            "Analyse the embeddings of one or more runs or checkpoints on the same images. The "
            "first is 'before' (e.g. the base model), the others are 'after' runs. Writes PNG "
            "figures, diagnostics.json and a self-contained report.html to --out."
        ),
    )
    p.add_argument("runs", nargs="+", metavar="RUN_OR_CHECKPOINT",
                   help="run directory (its kept model best.pt when it has one, else, or "
                        "with --last, its last step; and its metrics.jsonl) or checkpoint "
                        "file; the first is the reference the others are compared with")
    p.add_argument("--names", default=None, metavar="A,B,...",
                   help="comma-separated names of the runs in the report, one per run "
                        "(default: their directory or file names)")
    p.add_argument("--data", required=True, metavar="DATA",
                   help="dataset spec understood by e2mc.data.build_dataset ('builtin', a "
                        "folder, an .npz file)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="directory of the report: report.html, diagnostics.json, the figures")
    p.add_argument("--split", default="test", help="split to analyse (default: test)")
    p.add_argument("--num-samples", type=at_least(0), default=2048,
                   help="seeded random images analysed, the same for every run (default 2048; "
                        "0 = all)")
    p.add_argument("--image-size", type=at_least(1), default=None,
                   help="eval transform size (default: the images' own size if <= 64 px, "
                        "else 224)")
    p.add_argument("--batch-size", type=at_least(1), default=256,
                   help="feature extraction batch (default: 256)")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="device of the feature extraction: cpu, cuda, cuda:1 (default: cuda "
                        "when there is one, else cpu)")
    p.add_argument("--knn-k", type=at_least(1), default=None,
                   help="the far neighbour of the NN-distance statistics (default 100, at most "
                        "the sampled images less one, with a note)")
    p.add_argument("--sample-seed", type=int, default=0, metavar="N",
                   help="seed of the sampled images and dimension pairs (default 0)")
    p.add_argument("--accuracy-curve", action="store_true",
                   help="kNN top-1 of every per-epoch checkpoint (runs with checkpoints/)")
    p.add_argument("--accuracy-train-samples", type=at_least(1), default=5000,
                   help="training images in the kNN bank of the accuracy curve (default: "
                        "5000)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow pickled (non weights-only) checkpoints from trusted sources")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.add_argument("--last", action="store_true",
                   help="of each run directory, the last step's checkpoint instead of the kept "
                        "model (best.pt, when the run was trained with e2mc continue --keep-best)")
    p.set_defaults(func=run, libraries=("e2mc.diagnostics.analyze",))


def run(args: argparse.Namespace) -> int:
    import torch

    from e2mc.config import comma_list
    from e2mc.diagnostics.analyze import analyze, default_loader
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    json_path, html_path = analyze(
        args.runs, args.data, args.out, split=args.split,
        num_samples=args.num_samples or None, image_size=args.image_size,
        batch_size=args.batch_size, device=device, knn_k=args.knn_k, seed=args.sample_seed,
        accuracy_curve=args.accuracy_curve,
        accuracy_train_samples=args.accuracy_train_samples,
        loader=default_loader(trust=args.trust_checkpoint), progress=not args.quiet,
        last=args.last, names=comma_list(args.names) if args.names else None)
    print(f"wrote {json_path}\nwrote {html_path}")
    return 0
