"""One rule makes every verdict and its mark (issue 46 item 1, issue 48): the word BETTER/WORSE
and the cell's ▲/▼ come from one test, the same in the terminal, comparison.md and the page;
the answer the command prints last fits one screen."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from e2mc.cli import main
from e2mc.evaluation.results import compare_evaluations

N, CLASSES = 200, 10


def _eval(root: Path, entries: list[dict], info: dict | None = None) -> str:
    """A hand-written evaluation of N test images: each entry's fields, right on the images
    ``right`` (a boolean array; default: all but the first ``wrong``)."""
    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions
    from helpers import recorded_data

    labels = np.arange(N) % CLASSES
    written = []
    for i, fields in enumerate(entries):
        fields = dict(fields)
        ok = fields.pop("right", None)
        ok = np.arange(N) >= fields.pop("wrong") if ok is None else ok
        written.append({"primary": "top1", **fields,
                        "metrics": {"top1": 100 * ok.mean(), **fields.get("metrics", {})},
                        "predictions": save_predictions(
                            root, f"e{i}", np.where(ok, labels, (labels + 1) % CLASSES),
                            labels)})
    EvalDir(root).write({"entries": written, **recorded_data(labels),
                         **(info or {})})
    return str(root)


def _linear(right: dict[int, np.ndarray]) -> list[dict]:
    return [{"protocol": "linear", "column": "linear 1%", "fraction": 0.01, "seed": seed,
             "right": ok} for seed, ok in right.items()]


def _disagreeing(tmp_path: Path) -> tuple[str, str]:
    """Two seeds, each with 7 images only the run gets right and 2 only the reference (other
    images at each seed): no seed is significant alone (sign test p 0.18), pooled they are
    14 against 4 (p 0.031)."""
    base = np.arange(N) < 150
    run = {}
    for seed, start in ((0, 0), (1, 10)):
        ok = base.copy()
        ok[150 + start:157 + start] = True  # 7 gained
        ok[start:start + 2] = False  # 2 lost
        run[seed] = ok
    return (_eval(tmp_path / "ref", _linear({0: base, 1: base})),
            _eval(tmp_path / "run", _linear(run)))


def test_the_old_two_rules_disagree_here_and_the_one_rule_marks_what_it_calls_better(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref, run = _disagreeing(tmp_path)
    comp = compare_evaluations([ref, run], names=["continued", "e2mc"], n_resamples=4000)
    # the old mark's rule (every seed, both tests) said nothing here ...
    assert all(max(t["mcnemar_p"], t["permutation_p"]) > 0.05 for t in comp.tests)
    (verdict,) = comp.verdicts
    # ... the pooled test (the exact two-sided sign test of 14 against 4: p 0.031) says better
    assert verdict.p == pytest.approx(0.0309, abs=0.006)
    assert verdict.word == "BETTER than" and verdict.mark == "▲"
    assert comp.cells["e2mc"]["linear 1%"] == (pytest.approx(77.5), pytest.approx(0.0), "▲")
    out = tmp_path / "cmp"
    assert main(["compare", ref, run, "--names", "continued,e2mc", "--out", str(out),
                 "--resamples", "4000"]) == 0
    printed = capsys.readouterr().out.splitlines()
    p = f"{verdict.p:.2g}"
    headline = f"e2mc against continued: BETTER at linear 1% ▲ (+2.50 ± 0.00, p {p})"
    assert printed[-2] == headline  # the terminal
    md = (out / "comparison.md").read_text().splitlines()
    assert f"- {headline}" in md and "| e2mc | 77.50 ± 0.00▲ |" in md
    assert any(line.startswith("- e2mc, linear 1%: BETTER than continued ▲ (+2.50 ± 0.00 points "
                               f"over 2 label-subset seed(s), p {p}; significant alone at 0 ")
               for line in md)
    page = (out / "comparison.html").read_text()
    assert '<td class="better">77.50 ± 0.00▲</td>' in page
    assert ('<span class="better">BETTER</span> at linear 1% <span class="better">▲</span> '
            "(+2.50 ± 0.00, p") in page


def _verdicts_and_marks(md: list[str]) -> tuple[dict, dict]:
    """From comparison.md: ``(run, column) -> mark`` of every cell of the table, and of every
    verdict sentence (its mark, empty for no significant difference / not judged)."""
    table = [line for line in md if line.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    cells = {}
    for row in table[2:]:
        values = [c.strip() for c in row.strip("|").split("|")]
        if values[0] == "run":  # the per-seed table
            break
        for column, value in zip(head[1:], values[1:], strict=True):
            cells[values[0], column] = re.sub(r"[^▲▼]", "", value)
    said = {}
    for line in md:
        if (m := re.match(r"- (.+?), (.+?): (BETTER than|WORSE than|no significant|not judged)"
                          r".*? ([▲▼]*) ?\(", line)):
            said[m.group(1), m.group(2)] = (m.group(3), m.group(4))
    return cells, said


def test_on_a_real_comparison_every_verdict_has_its_mark_and_every_mark_its_verdict(
        tmp_path: Path) -> None:
    from test_evaluation_cli import tiny_run

    runs = [tiny_run(tmp_path, "a", 0, 0.0), tiny_run(tmp_path, "b", 1, 3.0),
            tiny_run(tmp_path, "c", 2, 1.0)]
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "--out", str(out), "--resamples", "500"]) == 0
    cells, said = _verdicts_and_marks((out / "comparison.md").read_text().splitlines())
    words = {w for w, _ in said.values()}  # both kinds: marked and not
    assert "no significant" in words and words & {"BETTER than", "WORSE than"}
    for (run, column), (word, mark) in said.items():
        assert cells[run, column] == mark  # the verdict's mark is in its cell
        assert bool(mark) == word.startswith(("BETTER", "WORSE"))
        assert not mark or mark[0] == ("▲" if word.startswith("BETTER") else "▼")
    marked = {k for k, m in cells.items() if m}
    assert marked and marked <= set(said)  # every marked cell has its verdict
    assert not any(m for (run, _), m in cells.items() if run == "a")  # the reference: none


def _rows(lines: list[str], width: int = 100) -> int:
    """The rows ``lines`` take on a terminal ``width`` columns wide."""
    return sum(max(1, math.ceil(len(line) / width)) for line in lines)


def test_the_answer_of_many_runs_columns_and_flags_fits_a_screen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three runs of the demo's shape (three linear fractions of 3 seeds, four kNN columns)
    with four flags each shared by the runs: the answer is at most 25 rows of a 100-column
    terminal, each flag once, the headline of every run and the page last."""
    use = {"epoch_use": {"images": 500, "batch": 256, "steps": 1, "dropped": 244}}
    info = {"num_train": 500, "checkpoint_info": use}
    rng = np.random.default_rng(0)
    dirs = []
    for i, name in enumerate(("continued", "e2mc", "base")):
        entries = [{"protocol": "linear", "column": f"linear {fraction:.0%}",
                    "fraction": fraction, "seed": seed,
                    "subset": {"kind": "stratified", "size": round(fraction * 500)},
                    "wrong": int(40 + 10 * i + rng.integers(0, 5))}
                   for fraction in (0.01, 0.1, 1.0) for seed in (0, 1, 2)]
        entries += [{"protocol": "knn", "column": f"knn k={k}{w}", "fraction": 1.0, "seed": 0,
                     "metrics": {"k": k}, "wrong": 50 + 15 * i}
                    for k in (20, 200) for w in ("", " uniform")]
        dirs.append(_eval(tmp_path / name, entries, info))
    out = tmp_path / "cmp"
    assert main(["compare", *dirs, "--names", "continued,e2mc,base", "--out", str(out),
                 "--resamples", "500"]) == 0
    printed = capsys.readouterr().out.splitlines()
    answer = printed[printed.index("") + 1:]
    assert answer == printed[1:]  # the answer is all compare prints
    assert _rows(answer) <= 25, "\n".join(answer)
    flags = [line for line in answer if line.startswith("flag: ")]
    assert len(flags) == len(set(flags)) == 3  # dropped images, few labels, kNN's bank
    assert [line.split(":")[0] for line in answer if " against continued: " in line] == [
        "e2mc against continued", "base against continued"]
    assert answer[-1] == f"page: {out / 'comparison.html'}"
    assert answer[0].startswith(f"files: the table, every verdict and the paired tests in {out}")
