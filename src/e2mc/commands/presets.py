"""``e2mc presets``: the shipped presets, one line each (name, base, description), or with
``--markdown`` their resolved settings as the table in docs/method.md#presets."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "presets", help="list the shipped presets, one line each",
        description="List the presets shipped with e2mc: name, the preset it starts from "
                    "(base) and its description. `e2mc config show NAME` prints one resolved.")
    p.add_argument("--markdown", action="store_true",
                   help="print the resolved settings of every preset as a Markdown table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from e2mc.config import preset_names, preset_summary

    names = preset_names()
    if args.markdown:
        print(markdown_table(names), end="")
        return 0
    width = max(map(len, names))
    for name in names:
        base, description = preset_summary(name)
        origin = f"[base: {base}] " if base else ""
        print(f"{name:<{width}}  {origin}{description}")
    return 0


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_value, value)) + "]"
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def _params(params: dict) -> str:
    return ", ".join(f"{k} {_value(v)}" for k, v in params.items()) or "–"


def markdown_table(names: list[str]) -> str:
    """One row per preset with the settings that tell presets apart (resolved values)."""
    from e2mc.config import load_config, preset_summary

    head = ("| preset | base | mode | backbone | method (params) | add-on (params) | "
            "optimizer | lr | wd | schedule | batch | epochs | precision | base epoch |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for name in names:
        cfg = load_config(name)
        base = preset_summary(name)[0]
        base_epoch = cfg.init.base_epoch if cfg.init.base_epoch is not None else "from file"
        scaling = " x batch/256" if cfg.optim.lr_scaling == "linear" else ""
        rows.append(
            f"| `{name}` | {f'`{base}`' if base else '–'} | {cfg.mode} | "
            f"{cfg.model.backbone}, {cfg.data.image_size or 'data'} px, "
            f"{cfg.data.channels or 'data'} ch | "
            f"{cfg.method.name} ({_params(cfg.method.params)}) | "
            f"{cfg.addon.name} ({_params(cfg.addon.params)}) | {_params(cfg.optim.params)} | "
            f"{cfg.optim.base_lr:g}{scaling} | {cfg.optim.weight_decay:g} | "
            f"{cfg.optim.schedule} | {'≤ ' * cfg.training.fit_batch}{cfg.training.batch_size} | "
            f"{cfg.training.epochs} | "
            f"{cfg.training.precision} | {base_epoch if cfg.mode == 'continue' else '–'} |")
    return "\n".join(rows) + "\n"
