"""``e2mc presets``: the shipped presets, one line each (name, base, description)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "presets", help="list the shipped presets, one line each",
        description="List the presets shipped with e2mc: name, the preset it starts from "
                    "(base) and its description. `e2mc config show NAME` prints one resolved.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from e2mc.training.config import preset_names, preset_summary

    names = preset_names()
    width = max(map(len, names))
    for name in names:
        base, description = preset_summary(name)
        origin = f"[base: {base}] " if base else ""
        print(f"{name:<{width}}  {origin}{description}")
    return 0
