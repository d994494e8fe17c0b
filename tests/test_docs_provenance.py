"""Every table of measured numbers in docs/ and README.md says the command and the commit that
produced it (issue 24).

A table is a Markdown table outside code fences (a row starting with ``|`` followed by a
delimiter row). It holds *measured* numbers when a body cell has a number with a decimal point,
a ``±`` or a per cent sign. Such a table needs a ``Produced by ... commit HASH`` line (the
command, or "command not recorded", and the short hash of the commit that added the numbers)
whose paragraph states the torch version that made them (``torch 2.14.1``), or says ``torch
version not recorded`` where nobody can know it any more (issue 33), either near it (within
``NEAR`` lines above or below, with no heading or other table in between)
or in the page's preamble (before its first ``## `` heading), which then covers every table of
a generated page. A table of settings, formats or formulas that looks measured by that rule is
marked with ``<!-- settings table -->`` right above it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MEASURED = re.compile(r"\d\.\d|±|\d\s*%")
PRODUCED = re.compile(r"^\s*Produced by\b.*\bcommits? [0-9a-f]{7,40}\b")
#: The torch version beside the commit: a version number, or the explicit phrase.
TORCH = re.compile(r"\btorch \d+\.\d+(\.\d+)?\b|\btorch version not recorded\b")
SETTINGS = "<!-- settings table -->"
NEAR = 8


def pages() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


def _is_delimiter(line: str) -> bool:
    s = line.strip()
    return s.startswith("|") and "-" in s and set(s) <= set("|-: ")


def _is_row(line: str) -> bool:
    return line.strip().startswith("|")


def tables(lines: list[str]) -> list[tuple[int, int]]:
    """(first line, one past the last line) of every Markdown table outside code fences."""
    found, fenced, i = [], False, 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
        elif (not fenced and _is_row(lines[i]) and i + 1 < len(lines)
              and _is_delimiter(lines[i + 1])):
            end = i + 2
            while end < len(lines) and _is_row(lines[end]):
                end += 1
            found.append((i, end))
            i = end
            continue
        i += 1
    return found


def is_measured(lines: list[str], start: int, end: int) -> bool:
    return any(MEASURED.search(cell) for row in lines[start + 2:end] for cell in row.split("|"))


def is_settings(lines: list[str], start: int) -> bool:
    """``<!-- settings table -->`` among the HTML comment lines right above the table."""
    i = start - 1
    while i >= 0 and lines[i].strip().startswith("<!--") and lines[i].strip().endswith("-->"):
        if lines[i].strip() == SETTINGS:
            return True
        i -= 1
    return False


def _stops(line: str) -> bool:
    return line.lstrip().startswith("#") or _is_row(line)


def paragraph(lines: list[str], i: int) -> str:
    """The line ``i`` and the lines that continue it (up to a blank line, table or heading)."""
    j = i + 1
    while j < len(lines) and lines[j].strip() and not _stops(lines[j]):
        j += 1
    return " ".join(line.strip() for line in lines[i:j])


def _produced(lines: list[str], i: int) -> bool:
    """A Produced-by line with its commit, whose paragraph states the torch version."""
    return bool(PRODUCED.match(lines[i])) and bool(TORCH.search(paragraph(lines, i)))


def has_provenance(lines: list[str], start: int, end: int) -> bool:
    preamble = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    if any(_produced(lines, i) for i in range(preamble)):
        return True
    for step, first, last in ((-1, start - 1, max(start - 1 - NEAR, -1)),
                              (1, end, min(end + NEAR, len(lines)))):
        for i in range(first, last, step):
            if _produced(lines, i):
                return True
            if _stops(lines[i]):
                break
    return False


def unsourced(text: str) -> list[tuple[int, str]]:
    """(line number, header row) of every measured table without a Produced-by line that
    states the commit and the torch version."""
    lines = text.splitlines()
    return [(start + 1, lines[start].strip()[:70]) for start, end in tables(lines)
            if is_measured(lines, start, end) and not is_settings(lines, start)
            and not has_provenance(lines, start, end)]


def test_every_measured_table_says_its_command_commit_and_torch_version():
    missing = [f"{page.relative_to(REPO)}:{line}: {header}"
               for page in pages() for line, header in unsourced(page.read_text(encoding="utf-8"))]
    assert not missing, (
        "tables of measured numbers without a 'Produced by: COMMAND at commit HASH (torch "
        "X.Y.Z, ...)' line next to them ('torch version not recorded' where it is unknowable; "
        "'<!-- settings table -->' right above a table of settings):\n"
        + "\n".join(missing))


def test_the_walk_finds_the_measured_tables():
    """The rule sees the result pages' tables (a parser that found none would pass anything)."""
    counts = {}
    for page in pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        counts[page.relative_to(REPO).as_posix()] = sum(
            is_measured(lines, s, e) and not is_settings(lines, s) for s, e in tables(lines))
    assert counts["docs/results/full-vicreg.md"] == 3
    assert counts["docs/demo.md"] == 1
    assert sum(counts.values()) >= 40


TABLE = "| run | linear 1% |\n|---|---|\n| continued | 64.87 ± 0.55 |\n"


def test_a_measured_table_without_its_line_is_found():
    intro = "# Page\n\n## Results\n\n"
    line = "Produced by: `e2mc demo` at commit 135e76b (torch 2.14.1, 2-core CPU).\n"
    assert unsourced(intro + TABLE) == [(5, "| run | linear 1% |")]
    assert unsourced(intro + TABLE + "\n" + line) == []
    assert unsourced(intro + line + "\n" + TABLE) == []
    # a command without a commit, or a line beyond a heading or another table, does not count
    assert unsourced(intro + TABLE + "\nProduced by: `e2mc demo`.\n") != []
    # the torch version is required: a number or the explicit phrase, in the line's paragraph
    bare = "Produced by: `e2mc demo` at commit 135e76b (2-core CPU).\n"
    assert unsourced(intro + TABLE + "\n" + bare) != []
    assert unsourced(intro + TABLE + "\n" + bare.replace("CPU)", "CPU;\ntorch 2.14.1)")) == []
    assert unsourced(intro + TABLE + "\n" + bare.replace("CPU)", "CPU; torch version not "
                                                          "recorded)")) == []
    assert unsourced(intro + TABLE + "\n" + bare + "\ntorch 2.14.1\n") != []  # another paragraph
    assert unsourced(intro + TABLE + "\n" + bare.replace("CPU)", "CPU; torch unknown)")) != []
    assert unsourced(intro + TABLE + "\n## Next\n\n" + line) != []
    other = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert unsourced(intro + TABLE + "\n" + other + "\n" + line) != []
    assert unsourced(intro + TABLE + "\n" + "text\n" * NEAR + line) != []
    # the preamble's line covers the page; a settings table is marked; integers are not measured
    page = "# Page\n\n" + line + "\n## Results\n\n" + TABLE + "\n## More\n\n" + TABLE
    assert unsourced(page) == []
    assert unsourced(intro + SETTINGS + "\n" + TABLE) == []
    assert unsourced(intro + "<!-- settings table -->\n<!-- generated -->\n" + TABLE) == []
    assert unsourced(intro + "| exit code | meaning |\n|---|---|\n| 2 | bad input |\n") == []
    # a table in a code fence is printed output, not a table of the page
    assert unsourced(intro + "```text\n" + TABLE + "```\n") == []
    # an indented table (in a list item) is a table too
    indented = "".join("  " + row + "\n" for row in TABLE.splitlines())
    assert unsourced(intro + "- item:\n\n" + indented) == [(7, "| run | linear 1% |")]


def test_a_generated_results_page_says_its_commit():
    """``reproduce_fashion_mnist.py --write-docs`` writes a page this test accepts."""
    from repro.provenance import produced_by, source_commit, torch_version
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    commit = source_commit()
    assert commit is not None and commit.removesuffix("+changes") == head
    line = produced_by("python benchmarks/reproduce_fashion_mnist.py --data builtin", commit,
                       torch_version())
    assert line.startswith("Produced by `python benchmarks/reproduce_fashion_mnist.py --data")
    assert PRODUCED.match(line + " (see `docs/reproduction.md`).")
    import torch

    assert f"torch {torch.__version__}" in line and TORCH.search(line)
    assert not PRODUCED.match(produced_by("python x.py", None))
    assert "(torch version not recorded)" in produced_by("python x.py", commit)
