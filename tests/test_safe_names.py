"""Names are safe in every output: a run, directory or trial name is text wherever e2mc shows
it. Markdown marks in a name (``![x](http://...)``: an image a viewer would load) are escaped in
every ``.md`` e2mc writes (comparison.md, search.md, confirm.md) by one helper,
:func:`e2mc.files.markdown_text`; a byte that is not UTF-8 (``os.fsdecode(b"run\\xff")``, as
argv and file names carry it) is shown as ``\\xff`` (:func:`e2mc.files.display_name`) in the
terminal, the .md, .html and .csv files and the figures, never a traceback."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from e2mc.cli import main
from e2mc.files import display_name, markdown_text
from helpers import one_column_eval_dir

INJECTION = "![x](http://a.invalid/p.png)"
NOT_UTF8 = os.fsdecode(b"run\xff")  # 'run\udcff'
SHOWN = "run\\xff"  # what the user sees: the text \xff


@pytest.mark.parametrize("name,shown", [
    (os.fsdecode(b"run\xff\xfe"), "run\\xff\\xfe"),
    ("line\nbreak\x1b[31m", "line\\nbreak\\x1b[31m"),
    ("\u202eevil", "\\u202eevil"),
    ("\ud800", "\\ud800"),  # a surrogate that stands for no byte
    ("plain é_ü", "plain é_ü"),
])
def test_display_name_shows_every_name_as_text(name: str, shown: str) -> None:
    assert display_name(name) == shown
    shown.encode("utf-8")  # writable anywhere


@pytest.mark.parametrize("name,escaped", [
    (INJECTION, "!\\[x\\](http://a.invalid/p.png)"),
    ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    ("a|b", "a\\|b"),
    ("*bold* _it_ `code` ~~s~~ $x$", "\\*bold\\* \\_it\\_ \\`code\\` \\~\\~s\\~\\~ \\$x\\$"),
    ("e2mc_beta_100", "e2mc_beta_100"),  # an underscore inside a word marks nothing
    ("# title", "\\# title"),
    ("- item", "\\- item"),
    ("1. item", "1\\. item"),
    ("a\\*b", "a\\\\\\*b"),  # the backslash shown, and the star
    (NOT_UTF8, SHOWN),  # \x is no escape in Markdown: shown as written
])
def test_markdown_text_escapes_the_marks_a_viewer_acts_on(name: str, escaped: str) -> None:
    assert markdown_text(name) == escaped


def _rendered(markdown: str) -> str:
    """The HTML a CommonMark viewer with GitHub's tables and strikethrough makes of it."""
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py is not installed")
    return markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]) \
        .render(markdown)


def test_a_viewer_shows_the_name_and_loads_nothing() -> None:
    import html

    for name in (INJECTION, "[link](javascript:alert(1))", "<img src=http://a.invalid/x>",
                 "*a* _b_ `c` ~~d~~", "# heading", "- item", "1. item", "a\\*b"):
        rendered = _rendered(f"- {markdown_text(name)}, linear 10%\n\n"
                             f"| run |\n|---|\n| {markdown_text(name)} |\n")
        for mark in ("<img", "<a ", "<em>", "<strong>", "<code>", "<del>", "<h1>", "<ol>"):
            assert mark not in rendered, (name, rendered)
        assert rendered.count("<ul>") == 1 and rendered.count("<td>") == 1
        assert html.escape(name, quote=False) in rendered.replace("&quot;", '"'), rendered


@pytest.fixture
def figure_texts(monkeypatch) -> list[str]:
    """Every text of every figure e2mc saves (titles, labels, legends), collected as it is
    saved."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    texts: list[str] = []
    save = Figure.savefig

    def recording(self, *args, **kwargs):
        texts.extend(t.get_text() for t in self.findobj(Text))
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    return texts


def test_a_markdown_name_through_compare(tmp_path: Path, capsys) -> None:
    a = one_column_eval_dir(tmp_path / "a", 100)
    b = one_column_eval_dir(tmp_path / "b", 160)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--names", f"{INJECTION},b", "--out", str(out),
                 "--resamples", "200"]) == 0
    md = (out / "comparison.md").read_text()
    assert INJECTION not in md and not re.search(r"(?<!\\)\]\(http", md)  # no link
    assert "!\\[x\\](http://a.invalid/p.png)" in md  # the reference, in the verdicts and table
    rendered = _rendered(md)
    assert rendered.count("<img") == 1 and 'src="comparison.png"' in rendered  # the chart only
    assert "<a " not in rendered and INJECTION in rendered  # shown as text, as given
    page = (out / "comparison.html").read_text()
    assert "http://a.invalid" not in page.replace(INJECTION, "")  # text, not a source
    assert '<img src="data:image/png;base64,' in page and page.count("<img") == 1
    assert INJECTION in (out / "comparison.csv").read_text()  # a CSV has no markup


def test_a_name_that_is_not_utf8_through_compare(tmp_path: Path, capsys,
                                                  figure_texts: list[str]) -> None:
    a = one_column_eval_dir(tmp_path / "a", 100)
    b = one_column_eval_dir(tmp_path / NOT_UTF8, 160)  # the directory's own name: not UTF-8
    out = tmp_path / "cmp"
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(out), "--resamples", "200"]) == 0
    printed = capsys.readouterr()
    assert SHOWN in printed.out and NOT_UTF8 not in printed.out
    assert "Traceback" not in printed.err
    for name in ("comparison.md", "comparison.html", "comparison.csv", "comparison_tests.csv"):
        text = (out / name).read_bytes().decode("utf-8")  # valid UTF-8 throughout
        assert SHOWN in text, name
    assert f"| {SHOWN} |" in (out / "comparison.md").read_text()
    assert any(SHOWN in t for t in figure_texts)  # the chart's legend and titles
    assert not any("\udcff" in t for t in figure_texts)

    # the same with --names, and a directory --out whose name is not UTF-8 either
    out2 = tmp_path / os.fsdecode(b"out\xfe")
    reference = os.fsdecode(b"ref\xfe")
    figure_texts.clear()
    assert main(["compare", str(a), str(b), "--names", f"{reference},{INJECTION}",
                 "--out", str(out2), "--resamples", "200"]) == 0
    printed = capsys.readouterr()
    assert "ref\\xfe" in printed.out and "out\\xfe" in printed.out
    md = (out2 / "comparison.md").read_text()
    assert "| ref\\xfe |" in md and "!\\[x\\](http://a.invalid/p.png)" in md
    assert any("ref\\xfe" in t for t in figure_texts)


def test_trial_names_in_search_and_confirm_markdown(tmp_path: Path,
                                                    figure_texts: list[str]) -> None:
    from e2mc.search.report import confirm_markdown, plot_trajectories, search_markdown

    trials = [{"name": INJECTION, "steps": 4, "start_value": 50.0, "control_value": 51.0,
               "value": 53.0, "difference": 2.0, "trajectory": [[0, 50.0], [4, 53.0]],
               "control_trajectory": [[0, 50.0], [4, 51.0]]},
              {"name": NOT_UTF8, "steps": 4, "start_value": 50.0, "control_value": 51.0,
               "value": 50.5, "difference": -0.5, "trajectory": [[0, 50.0], [4, 50.5]],
               "control_trajectory": [[0, 50.0], [4, 51.0]]},
              {"name": "*no* result", "difference": None, "trajectory": [],
               "control_trajectory": []}]
    record = {"spec": {"config": "[cfg](http://a.invalid)", "metric": "val/knn",
                       "val_split": 0.2, "seed": 0, "rule": "the largest difference"},
              "trials": trials, "selected": INJECTION}
    md = search_markdown(record)
    assert INJECTION not in md and not re.search(r"(?<!\\)\]\(http", md)  # no link
    assert "| !\\[x\\](http://a.invalid/p.png) **selected** |" in md
    assert f"| {SHOWN} |" in md and "| \\*no\\* result |" in md
    assert "Selected: **!\\[x\\](http://a.invalid/p.png)**." in md
    assert "# Search: \\[cfg\\](http://a.invalid)" in md
    rendered = _rendered(md)
    assert rendered.count("<img") == 1 and 'src="search.png"' in rendered
    assert "<a " not in rendered
    plot_trajectories(record, tmp_path / "search.png")  # a figure, not a TypeError
    assert any(SHOWN in t for t in figure_texts) and any(INJECTION in t for t in figure_texts)

    confirm = confirm_markdown({"trial": INJECTION, "seeds": [0, 1], "columns": {
        "linear | 10%": {"difference": {"mean": 1.0, "se": 0.5}, "significant_better": 1,
                         "significant_worse": 0, "pairs": 2, "pooled_p": 0.04}}})
    assert "# Confirmation of !\\[x\\](http://a.invalid/p.png) on the test split" in confirm
    assert "| linear \\| 10% |" in confirm
    assert "<img" not in _rendered(confirm)


def test_a_name_that_is_not_utf8_through_analyze(tmp_path: Path, capsys,
                                                 figure_texts: list[str]) -> None:
    import shutil

    from helpers import tiny_base

    ckpt, data = tiny_base(tmp_path)
    other = tmp_path / f"{NOT_UTF8}.pt"
    shutil.copy(ckpt, other)
    out = tmp_path / "an"
    assert main(["analyze", str(ckpt), str(other), "--data", str(data), "--num-samples", "16",
                 "--knn-k", "3", "--quiet", "--device", "cpu", "--out", str(out)]) == 0
    page = (out / "report.html").read_bytes().decode("utf-8")
    assert f"<h3>{SHOWN}</h3>" in page and "\udcff" not in page
    assert any(SHOWN in t for t in figure_texts)
    assert "Traceback" not in capsys.readouterr().err
