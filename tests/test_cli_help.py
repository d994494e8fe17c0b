"""One CLI grammar (issue 24): every option of every subcommand says what it does."""

from __future__ import annotations

import argparse

from e2mc.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _subparsers(sub, f"{prefix}{name} ")


def test_every_option_of_every_subcommand_has_help() -> None:
    missing = [f"{name} {action.option_strings or action.dest}"
               for name, sub in _subparsers(build_parser())
               for action in sub._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not action.help]
    assert len(list(_subparsers(build_parser()))) >= 11
    assert missing == []


def test_help_texts_format_and_name_no_doubled_percent(capsys) -> None:
    for name, sub in _subparsers(build_parser()):
        text = sub.format_help()
        assert "%%" not in text, name
