"""Docs that cannot drift (issue 33, item 4): every ``e2mc`` command in the shell blocks of
README.md and docs/ parses with the real argparse parsers (its options exist, take the values
given, and the required ones are there), unless the block marks it illustrative with a line
``# illustrative`` (a synopsis with ``[--optional]`` brackets, ``...``). The README's Python
blocks run in tests/test_readme.py; the demo, the hints and the examples on the shipped data
run in their own tests (test_demo.py, test_printed_hints.py, test_bring_your_model.py)."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from e2mc.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
ILLUSTRATIVE = "# illustrative"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def commands(page: Path) -> list[tuple[int, str, bool]]:
    """``(line, command without 'e2mc', illustrative)`` of each e2mc command in the page's
    bash/sh/shell blocks; continuation lines joined, comments dropped."""
    found, block, start, marked = [], None, 0, False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if block is None:
            if stripped.startswith("```") and stripped[3:].strip() in ("bash", "sh", "shell"):
                block, marked = [], False
            continue
        if stripped.startswith("```"):
            joined = "\n".join(block).replace("\\\n", " ")
            for offset, text in enumerate(joined.splitlines()):
                for part in re.split(r"&&|;|\|", text):
                    m = re.search(r"(?:^|\s)(?:e2mc|-m e2mc)\s+(.*)$", part.strip())
                    if m and not part.strip().startswith(("pip", "python -m pip")):
                        found.append((start + offset, m.group(1).strip(), marked))
            block = None
            continue
        if stripped.startswith(ILLUSTRATIVE):
            marked = True
        if not block:
            start = number
        block.append(line.split(" #")[0] if not stripped.startswith("#") else "")
    return found


ALL = [(page, line, cmd, marked) for page in pages() for line, cmd, marked in commands(page)]


def test_the_docs_have_commands_and_most_are_checked() -> None:
    checked = [c for c in ALL if not c[3]]
    print(f"{len(checked)} commands parsed, {len(ALL) - len(checked)} marked illustrative")
    assert len(checked) >= 40 and len(checked) > 3 * (len(ALL) - len(checked))


@pytest.mark.parametrize("page,line,command,marked",
                         [c for c in ALL if not c[3]],
                         ids=[f"{c[0].relative_to(REPO)}:{c[1]}" for c in ALL if not c[3]])
def test_every_documented_command_parses(page: Path, line: int, command: str,
                                         marked: bool, capsys) -> None:
    parser = build_parser()
    argv = shlex.split(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        err = capsys.readouterr().err.strip().splitlines()
        if stop.code == 0:  # --help, --version
            return
        pytest.fail(f"{page.relative_to(REPO)}:{line}: e2mc {command}\n  {err[-1] if err else ''}")
    assert args.command == argv[0]


CHEAP = ("presets", "config")  # run, not only parsed: instant, no data, no files written
LISTING = [c for c in ALL if not c[3] and c[2].split()[0] in CHEAP
           and ".yaml" not in c[2]]  # (a YAML file of the reader's own is not here)


@pytest.mark.parametrize("page,line,command", [c[:3] for c in LISTING],
                         ids=[f"{c[0].relative_to(REPO)}:{c[1]}" for c in LISTING])
def test_documented_listing_commands_run(page: Path, line: int, command: str, capsys) -> None:
    from e2mc.cli import main

    assert main(shlex.split(command)) == 0, f"{page.relative_to(REPO)}:{line}"
    assert capsys.readouterr().out.strip()


def python_blocks() -> list[tuple[Path, int, str]]:
    found = []
    for page in pages():
        text = page.read_text()
        for m in re.finditer(r"```python\n(.*?)^\s*```", text, flags=re.S | re.M):
            found.append((page, text[:m.start()].count("\n") + 1,
                          textwrap.dedent(m.group(1))))  # a block inside a list item
    return found


def test_every_documented_python_block_is_python() -> None:
    """Each block compiles (the README's blocks also run: tests/test_readme.py)."""
    import ast

    blocks = python_blocks()
    assert len(blocks) >= 5
    for page, line, code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as err:
            pytest.fail(f"{page.relative_to(REPO)}:{line + (err.lineno or 0)}: {err.msg}")
