"""The page with the answer (issue 33): comparison.html opens on the verdicts, then the table;
user-given names are escaped in the HTML and the markdown (issue 31, item 8); both pages fit a
phone's screen (issue 48); the diagnostics report points out a large change of the method's own
loss and what to expect of it."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from e2mc.cli import main
from helpers import one_column_eval_dir

HOSTILE = "<script>alert(1)</script>"


def _compare(tmp_path: Path, names: str) -> Path:
    a = one_column_eval_dir(tmp_path / "a", 150)  # 75 %: above the chance of 2 classes
    b = one_column_eval_dir(tmp_path / "b", 190)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--names", names, "--out", str(out),
                 "--resamples", "200"]) == 0
    return out


def _cells(row: str) -> list[str]:
    """The cells of a markdown table row, splitting only at unescaped ``|``."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def test_names_are_escaped_in_the_markdown_and_the_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _compare(tmp_path, f"ref|erence,{HOSTILE}")
    printed = capsys.readouterr().out
    assert f"page: {out / 'comparison.html'}" \
        in printed
    md = (out / "comparison.md").read_text()
    page = (out / "comparison.html").read_text()
    for text in (md, page):
        assert HOSTILE not in text and "<script" not in text
    assert html.escape(HOSTILE) in page
    table = [line for line in md.splitlines() if line.startswith("|")]
    header = _cells(table[0])
    assert header == ["run", "linear 10%"]
    rows = {_cells(line)[0]: _cells(line) for line in table[2:4]}
    assert set(rows) == {r"ref\|erence", html.escape(HOSTILE, quote=False)}
    assert all(len(r) == len(header) for r in rows.values())  # the | did not add a cell


def test_the_page_opens_on_the_answer_then_the_table_then_the_rules(tmp_path: Path) -> None:
    out = _compare(tmp_path, "continued,e2mc")
    page = (out / "comparison.html").read_text()
    answer = page[page.index('<div class="answer">'):page.index("<table>")]
    # 190 against 150 of 200 images right at both seeds: better, pooled over the two seeds
    assert re.sub(r"<[^>]+>", "", answer).startswith(
        "e2mc against continued: BETTER at linear 10% ▲▲ (+20.00 ± 0.00, p 0.005)key: "
        "difference from continued in top-1 points ± over 2 label-subset seeds")
    assert '<span class="better">BETTER</span> at linear 10% <span class="better">▲▲' in answer
    rules = page.index("What the marks mean")
    assert page.index("<table>") < page.index("data:image/png;base64,") < rules
    assert "1 verdict(s) at p &lt; 0.05 each" in page[rules:]
    assert "averaged over the label-subset seeds" in page[rules:]
    # a phone's viewport; the tables scroll in their own box, numbers do not break
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert page.count('<div class="scroll"><table>') == page.count("<table>") == 2
    assert "white-space:nowrap" in page


def test_the_report_points_out_a_large_change_of_the_method_loss(tmp_path: Path) -> None:
    """A rise of the method's loss says what to expect of it: with an add-on (its loss logged
    other than 0) the run trades the method's loss for the add-on's terms; without one, a rise
    is not expected."""
    from e2mc.diagnostics.figures import loss_terms
    from e2mc.diagnostics.report import RunDiagnostics, loss_change, write_report

    def run(name: str, first: float, last: float, addon: float) -> RunDiagnostics:
        records = [{"step": 5, "base/loss": first, "addon/loss": addon},
                   {"step": 20, "base/loss": (first + last) / 2, "addon/loss": addon},
                   {"step": 39, "base/loss": last, "addon/loss": addon}]
        return RunDiagnostics(name, f"{name}.pt", loss_change=loss_change(loss_terms(records)))

    json_path, page = write_report(tmp_path, [run("continued", 19.5, 19.3, 0.0),
                                              run("e2mc", 20.0, 110.0, -9.0),
                                              run("plain", 10.0, 30.0, 0.0),
                                              run("fast", 30.0, 10.0, 0.0)])
    found = json.loads(json_path.read_text())["verdict"]
    assert found[:4] == [
        "continued: its method's loss (base/loss) moved less than 2× during training "
        "(19.5 at step 5 → 19.3 at step 39)",
        "e2mc: its method's loss (base/loss) rose 5.5× during training (20 at step 5 → 110 "
        "at step 39); expected with an add-on: the run minimises the method's loss plus the "
        "add-on's terms (E2MC: − β · entropy + γ · covariance), and gives up some of the "
        "first for the second; whether the trade paid is in the tested accuracies (e2mc "
        "compare)",
        "plain: its method's loss (base/loss) rose 3.0× during training (10 at step 5 → 30 at "
        "step 39); not expected of a run trained on its method's loss alone: see its training "
        "curves (loss terms, learning rate)",
        "fast: its method's loss (base/loss) fell 3.0× during training (30 at step 5 → 10 at "
        "step 39)"]
    text = page.read_text()
    assert text.index("rose 5.5×") < text.index("<h2>Statistics")
    assert loss_change(loss_terms([{"step": 1, "base/loss": 3.0}])) is None  # one record
    # a phone's viewport; wide tables scroll in their own box
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    assert text.count('<div class="scroll"><table') == text.count("<table")
