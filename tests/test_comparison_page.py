"""The page with the answer (issue 33): comparison.html opens on the verdicts, then the table;
user-given names are escaped in the HTML and the markdown (issue 31, item 8); the diagnostics
report points out a large change of the method's own loss."""

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
        "e2mc BETTER than continued at linear 10% (+20.00 ± 0.00 points, pooled permutation p")
    rules = page.index("What the marks mean")
    assert page.index("<table>") < page.index("data:image/png;base64,") < rules
    assert "1 verdict(s) are tested at p &lt; 0.05" in page[rules:]
    assert "pooled" in page[rules:] and "every</i> seed" in page[rules:]


def test_the_report_points_out_a_large_change_of_the_method_loss(tmp_path: Path) -> None:
    from e2mc.diagnostics.figures import loss_terms
    from e2mc.diagnostics.report import RunDiagnostics, loss_change, write_report

    def run(name: str, first: float, last: float) -> RunDiagnostics:
        records = [{"step": 5, "base/loss": first, "addon/loss": 9.0},
                   {"step": 20, "base/loss": (first + last) / 2},
                   {"step": 39, "base/loss": last}]
        return RunDiagnostics(name, f"{name}.pt", loss_change=loss_change(loss_terms(records)))

    json_path, page = write_report(tmp_path, [run("continued", 19.5, 19.3),
                                              run("e2mc", 20.0, 110.0)])
    found = json.loads(json_path.read_text())["verdict"]
    assert found == [
        "continued: its method's loss (base/loss) moved less than 2× during training "
        "(19.5 at step 5 → 19.3 at step 39)",
        "e2mc: its method's loss (base/loss) rose 5.5× during training (20 at step 5 → 110 "
        "at step 39)"]
    text = page.read_text()
    assert text.index("rose 5.5×") < text.index("<h2>Statistics")
    assert loss_change(loss_terms([{"step": 1, "base/loss": 3.0}])) is None  # one record
