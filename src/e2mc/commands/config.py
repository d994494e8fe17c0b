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

    print(load_config(args.config, args.overrides).to_yaml(), end="")
    return 0
