"""The repository stands on its own: no tracked file names a path of the machine it was written
on or a document that is not in the repository, and every link between documents resolves."""

from __future__ import annotations

import re
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Written with escapes so that this file does not contain what it looks for.
OUTSIDE = {
    "the development machine's shared folders": re.compile(r"(?<![\w.~-])/work\/"),
    "a sibling folder of the checkout": re.compile(r"\.\./shared\b"),
    "a home directory": re.compile(r"(?<![\w.~-])/(?:home|Users)/[\w.-]+\/|(?<![\w.~-])/root\/"),
    "a document kept outside the repository": re.compile(r"\b(?:METHOD|DESIGN)\.md\b"),
}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
POINTER = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.md)(#[\w-]+)?")


@cache
def tracked_text_files() -> dict[str, str]:
    """Every tracked text file (path relative to the repository -> content)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = {}
    for name in filter(None, names):
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        try:
            files[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return files


def _outside_patterns() -> dict[str, re.Pattern[str]]:
    patterns = dict(OUTSIDE)
    parent = REPO.parent
    # The folder that holds the checkout, unless it is the root or the system's temporary
    # folder (a clone in /tmp would flag the docs' "--out /tmp/demo" examples).
    if parent not in (Path(parent.anchor), Path(tempfile.gettempdir()).resolve()):
        patterns["the folder around the checkout"] = re.compile(re.escape(f"{parent}/"))
    return patterns


def test_no_tracked_file_names_a_path_or_document_outside_the_repository() -> None:
    found = []
    patterns = _outside_patterns()
    for name, text in tracked_text_files().items():
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in patterns.items():
                if pattern.search(line):
                    found.append(f"{name}:{number}: {what}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings (repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def _prose(markdown: str) -> str:
    """Markdown without fenced code blocks and inline code."""
    markdown = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", markdown)


def _check_target(source: str, target: Path, anchor: str) -> str | None:
    try:
        target.resolve().relative_to(REPO)
    except ValueError:
        return f"{source}: {target} is outside the repository"
    if not target.exists():
        return f"{source}: {target.relative_to(REPO)} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{source}: {target.relative_to(REPO)} has no heading for #{anchor}"
    return None


def test_markdown_links_resolve() -> None:
    broken = []
    for name, text in tracked_text_files().items():
        if not name.endswith(".md"):
            continue
        here = REPO / name
        for m in LINK.finditer(_prose(text)):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            error = _check_target(name, here.parent / path if path else here, anchor)
            if error:
                broken.append(error)
    assert not broken, "\n".join(broken)


def test_pointers_to_docs_resolve() -> None:
    """``docs/<page>.md#section`` in code, comments and docs names a page and heading that
    exist (mentions of pages a script writes, ``--write-docs docs/results/X.md``, excepted)."""
    broken = []
    for name, text in tracked_text_files().items():
        for m in POINTER.finditer(text):
            before = text[max(0, m.start() - 13):m.start()]
            if before.endswith(("--write-docs ", "(e.g. ")):  # a page a script would write
                continue
            error = _check_target(name, REPO / m.group(1), (m.group(2) or "#")[1:])
            if error:
                broken.append(error)
    assert not broken, "\n".join(broken)


def test_the_checks_catch_what_they_are_for(tmp_path) -> None:
    patterns = _outside_patterns()
    home = "/" + "home/someone/data"
    shared = ".." + "/shared/data"
    doc = "METHOD" + ".md §2"
    for line in (home, shared, f"see {doc}", "/" + "work/x"):
        assert any(p.search(line) for p in patterns.values()), line
    for line in ("~/.cache/e2mc/features", "--out /tmp/demo", "PATH/TO/fashion-mnist",
                 "RUNS/search", "docs/method.md"):
        assert not any(p.search(line) for p in patterns.values()), line
    assert slug("Presets (`src/e2mc/configs/*.yaml`)") == "presets-srce2mcconfigsyaml"
    assert slug("Marginal entropy: the m-spacings estimator") == \
        "marginal-entropy-the-m-spacings-estimator"
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Part\n\n## Part\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"title", "part", "part-1"}


def test_report_paths_become_placeholders() -> None:
    from repro.provenance import public_command, public_path  # benchmarks/ is on pytest's path

    machine = "/" + "srv/lab"
    command = (f"python benchmarks/reproduce_fashion_mnist.py --data {machine}/data/fashion-mnist "
               f"--transfer-data={machine}/data/mnist --out {machine}/runs/full --methods vicreg "
               f"--base-run vicreg={machine}/runs/base/bases/vicreg --base-run swav=/elsewhere/b "
               "--continue-set data.limit=100 --write-docs docs/results/full.md")
    assert public_command(command) == (
        "python benchmarks/reproduce_fashion_mnist.py --data PATH/TO/fashion-mnist "
        "--transfer-data PATH/TO/mnist --out RUNS/full --methods vicreg "
        "--base-run vicreg=RUNS/base/bases/vicreg --base-run swav=RUNS/b "
        "--continue-set data.limit=100 --write-docs docs/results/full.md")
    assert public_path("builtin", data=True) == "builtin"
    assert public_path("benchmarks/out/repro") == "benchmarks/out/repro"
