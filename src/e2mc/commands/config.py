"""``e2mc config show NAME_OR_FILE [--set key=value ...]``: the resolved configuration as YAML."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "config", help="show the resolved configuration of a preset or YAML file",
        description="Inspect configurations: presets and YAML files may start from another "
                    "one (`base: NAME`); `show` prints the result with every key.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", help="print the resolved configuration (its base chain and --set applied)",
        description="Print the configuration a run with `--config NAME_OR_FILE` and these "
                    "`--set` overrides would use, as YAML (the same as RUN_DIR/config.yaml).")
    show.add_argument("config", metavar="NAME_OR_FILE", help="preset name or YAML file")
    show.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="override a config key (repeatable)")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    from e2mc.config import load_config

    cfg = load_config(args.config, args.overrides)
    print(cfg.to_yaml(), end="")
    _print_auto(cfg)
    return 0


def _print_auto(cfg: object) -> None:
    """What the keys left to ``auto`` become on this machine, as YAML comments."""
    import torch

    from e2mc.training.hardware import hardware_choices

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") \
        if cfg.training.device == "auto" else torch.device(cfg.training.device)
    choices = hardware_choices(cfg, device)
    if choices:
        print(f"# auto on this machine ({device.type}):")
        for key, choice in choices.items():
            value = str(choice.value).lower() if isinstance(choice.value, bool) else choice.value
            print(f"#   {key}: {value}  ({choice.reason})")
