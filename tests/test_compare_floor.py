"""``e2mc compare --floor``: the random-init floor is the first row, with every column, and the
tests stay against the first compared run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from e2mc.artifacts import EvalDir
from e2mc.evaluation.compare import RULE
from e2mc.evaluation.results import (
    compare_evaluations,
    comparison_markdown,
    mean_se,
)
from e2mc.files import markdown_text
from helpers import recorded_data
from test_evaluation_cli import tiny_run


@pytest.fixture(scope="module")
def evals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("floor")
    return (tiny_run(root, "floor", 5, 3.0), tiny_run(root, "a", 0, 0.0),
            tiny_run(root, "b", 1, 1.0))


def test_floor_is_the_first_row_and_not_the_reference(evals: tuple[Path, Path, Path]) -> None:
    floor, a, b = evals
    plain = compare_evaluations([str(a), str(b)], n_resamples=100)
    comp = compare_evaluations([str(a), str(b)], n_resamples=100, floor=str(floor))
    assert comp.runs == ["random init", "a", "b"] and comp.reference == "a"
    assert comp.tests == plain.tests  # the floor changes no test
    record = EvalDir(floor).load()
    for column in comp.columns:
        values = [e.metrics[e.primary] for e in record.column(column)]
        mean, se = mean_se(values)
        assert comp.cells["random init"][column] == (pytest.approx(mean), pytest.approx(se), "")
    md = comparison_markdown(comp).splitlines()
    assert md[0].startswith("Verdict against a")  # the verdicts come before the table
    table = md.index("| run | " + " | ".join(comp.columns) + " |")
    assert md[table + 2].startswith("| random init |")  # first row under the header
    text = "\n".join(md)
    assert f"Verdicts and marks against a: {markdown_text(RULE)}." in text
    assert "not tested" in text
    assert "random init, " not in text  # the floor gets no verdict
    with pytest.raises(ValueError, match="also a run's name"):
        compare_evaluations([str(a), str(b)], names=["random init", "b"], floor=str(floor))
    with pytest.raises(ValueError):  # the command turns this into one error line, exit 2
        compare_evaluations([str(a)], floor=str(a.parent / "nowhere"))


def test_compare_command_floor_option(evals: tuple[Path, Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from e2mc.cli import main

    floor, a, b = evals
    code = main(["compare", str(a), str(b), "--floor", str(floor), "--out",
                 str(tmp_path / "cmp"), "--resamples", "100"])
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("| ") for line in printed)  # the table: in the files
    assert printed[-2].startswith("b against a: ")  # the floor gets no headline
    assert not any(line.startswith("random init against") for line in printed)
    written = [line for line in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
               if line.startswith("| ")]
    assert written[1].startswith("| random init |") and written[2].startswith("| a |")
    assert main(["compare", str(a), "--floor", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("e2mc compare: error:")


def _eval(root, correct: np.ndarray, seeds=(0, 1), image_size: int = 28):
    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions

    labels = np.zeros(len(correct), dtype=np.int64)
    entries = [{"protocol": "linear", "column": "linear 1%", "fraction": 0.01, "seed": s,
                "primary": "top1", "metrics": {"top1": 100 * correct.mean()},
                "predictions": save_predictions(root, f"linear_1_s{s}",
                                                np.where(correct, 0, 1), labels)}
               for s in seeds]
    EvalDir(root).write({"entries": entries, "image_size": image_size,
                         **recorded_data(labels)})
    return str(root)


def test_a_significantly_worse_row_is_marked_and_called_worse(tmp_path, capsys):
    """The mark and the verdict carry the direction: 60 of 200 images lost is ▼▼ and WORSE,
    40 gained is ▲▲ and BETTER, in the headlines compare prints and in comparison.md."""
    from e2mc.cli import main

    ref = _eval(tmp_path / "ref", np.arange(200) < 150)
    worse = _eval(tmp_path / "worse", np.arange(200) < 90)  # the first 90 of ref's 150
    better = _eval(tmp_path / "better", np.arange(200) < 190)  # ref's 150 and 40 more
    comp = compare_evaluations([ref, worse, better], names=["continued", "e2mc", "other"],
                        n_resamples=500)
    assert comp.cells["e2mc"]["linear 1%"][2] == "▼▼"
    assert comp.cells["other"]["linear 1%"][2] == "▲▲"
    assert main(["compare", ref, worse, better, "--names", "continued,e2mc,other",
                 "--out", str(tmp_path / "cmp"), "--resamples", "500"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:-1] == ["e2mc against continued: WORSE at linear 1% ▼▼ (-30.00 ± 0.00, p "
                          "0.002)", "other against continued: BETTER at linear 1% ▲▲ (+20.00 ± "
                          "0.00, p 0.002)"]
    md = (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
    assert md[0].startswith("Verdict against continued")
    assert "- e2mc, linear 1%: WORSE than continued ▼▼ (-30.00 ± 0.00 points over 2 label-subset "\
           "seed(s), p 0.002; significant alone at 0 seed(s) better, 2 worse)" in md
    assert any(line.startswith("- other, linear 1%: BETTER than continued ▲▲ (+20.00")
               for line in md)
    assert "| e2mc | 45.00 ± 0.00▼▼ |" in md


def test_compare_refuses_evaluations_at_different_image_sizes(tmp_path, capsys):
    from e2mc.cli import main

    a = _eval(tmp_path / "a", np.arange(200) < 150)
    b = _eval(tmp_path / "b", np.arange(200) < 150, image_size=224)
    assert main(["compare", a, b, "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image size (a: 28 px; b: 224 px)" in err
    assert main(["compare", a, b, "--out", str(tmp_path / "cmp"), "--allow-mismatch"]) == 0


def test_compare_chart_names_the_reference_and_explains_the_marks(
        evals: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's legend says which run is the reference and which the floor and gives the
    rule of the marks; under each protocol's values a panel draws each run's paired difference
    from the reference (the verdicts' numbers), filled exactly where the verdict is BETTER or
    WORSE, and the values carry the cells' marks."""
    import matplotlib.pyplot as plt

    from e2mc.evaluation.results import plot_comparison

    floor, a, b = evals
    comp = compare_evaluations([str(a), str(b)], n_resamples=100, floor=str(floor))
    shown = []
    monkeypatch.setattr(plt, "close", shown.append)
    plot_comparison(comp, tmp_path / "chart.png")
    fig = shown[0]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:3] == ["random init (floor, not tested)", "a (reference)", "b"]
    assert texts[3].replace("\n", " ") == (
        "▲ / ▼, filled: BETTER / WORSE than a, p < 0.05 (▲▲ / ▼▼: p < 0.01); hollow: not; p: "
        "paired permutation test over the test images, pooled over the label-subset seeds")
    groups = ["linear", "knn", "svm"]
    assert len(fig.axes) == 2 * len(groups)  # the values, and the differences from a
    said = {v.column: v.direction in ("better", "worse") for v in comp.verdicts}
    assert any(said.values()) and not all(said.values())  # both kinds of marker drawn
    for protocol in groups:
        top, low = (next(ax for ax in fig.axes if ax.get_title() == title) for title in (
            f"{protocol}: mean ± SE over seeds" if protocol == "linear" else f"{protocol}: "
            "one seed", f"{protocol}: difference from a"))
        points = [line for line in low.lines if line.get_marker() == "o"]
        columns = [c for c in comp.columns if c.split(" ", 1)[0] == protocol]
        assert len(points) == len(columns)
        for line, column in zip(points, columns, strict=True):
            mean, _ = mean_se(t["difference"] for t in comp.tests
                              if t["run"] == "b" and t["column"] == column)
            assert line.get_ydata()[0] == pytest.approx(mean)
            assert (line.get_markerfacecolor() != "white") == said[column]
        marks = [t.get_text() for t in top.texts]  # the values' marks: the verdicts'
        assert marks == [comp.cells["b"][c][2] for c in columns if comp.cells["b"][c][2]]
    plt.close(fig)
    shown.clear()
    plot_comparison(compare_evaluations([str(a)]), tmp_path / "alone.png")  # nothing tested
    fig = shown[0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["a"]
    assert fig.get_suptitle() == "accuracy by column" and len(fig.axes) == len(groups)
    plt.close(fig)
