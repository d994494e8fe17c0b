"""``e2mc compare --floor``: the random-init floor is the first row, with every column, and the
tests stay against the first compared run."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2mc.evaluation.results import compare_runs, comparison_markdown, load_run, mean_se
from test_evaluation_cli import tiny_run


@pytest.fixture(scope="module")
def evals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("floor")
    return (tiny_run(root, "floor", 5, 3.0), tiny_run(root, "a", 0, 0.0),
            tiny_run(root, "b", 1, 1.0))


def test_floor_is_the_first_row_and_not_the_reference(evals: tuple[Path, Path, Path]) -> None:
    floor, a, b = evals
    plain = compare_runs([str(a), str(b)], n_resamples=100)
    comp = compare_runs([str(a), str(b)], n_resamples=100, floor=str(floor))
    assert comp.runs == ["random init", "a", "b"] and comp.reference == "a"
    assert comp.tests == plain.tests  # the floor changes no test
    record = load_run(floor)
    for column in comp.columns:
        values = [e.metrics[e.primary] for e in record.column(column)]
        mean, se = mean_se(values)
        assert comp.cells["random init"][column] == (pytest.approx(mean), pytest.approx(se), "")
    md = comparison_markdown(comp)
    assert md.splitlines()[2].startswith("| random init |")  # first row under the header
    assert "against a at every seed" in md and "not tested" in md
    with pytest.raises(ValueError, match="also a run's name"):
        compare_runs([str(a), str(b)], names=["random init", "b"], floor=str(floor))
    with pytest.raises(ValueError):  # the command turns this into one error line, exit 2
        compare_runs([str(a)], floor=str(a.parent / "nowhere"))


def test_compare_command_floor_option(evals: tuple[Path, Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from e2mc.cli import main

    floor, a, b = evals
    code = main(["compare", str(a), str(b), "--floor", str(floor), "--out",
                 str(tmp_path / "cmp"), "--resamples", "100"])
    assert code == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| random init |") and rows[2].startswith("| a |")
    assert (tmp_path / "cmp.md").read_text().splitlines()[2].startswith("| random init |")
    assert main(["compare", str(a), "--floor", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("e2mc compare: error:")
