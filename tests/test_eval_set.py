"""``e2mc eval A B ... --out DIR`` (e2mc.eval_set): several checkpoints evaluated alike, each
into ``DIR/<name>/``, inline or each as a job through submitit's local executor: the same
numbers either way, nothing resubmitted on a second run, a failed job stops with its log
tail, names that never collide."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from e2mc.artifacts import EvalDir, EvalSetDir, evaluation_set_names
from e2mc.cli import main
from helpers import other_weights, tiny_base

EVAL = ["--protocol", "knn,linear", "--fractions", "1", "--seeds", "0", "--epochs", "2",
        "--knn-k", "3", "--knn-weighting", "weighted", "--image-size", "16", "--no-cache", "-q"]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """Two checkpoints with other weights (a tiny base and a changed copy) and their data."""
    root = tmp_path_factory.mktemp("eval-set")
    checkpoint, data = tiny_base(root)
    other = other_weights(checkpoint, root / "other" / "base.pt")
    return [str(checkpoint), str(other)], data


def _eval(checkpoints: list[str], data: Path, out: Path, *extra: str) -> int:
    return main(["eval", *checkpoints, "--data", str(data), "--out", str(out), *EVAL, *extra])


def _values(out: Path) -> dict[str, dict[str, list[float]]]:
    names = json.loads(EvalSetDir(out).index.read_text())["checkpoints"]
    out_values = {}
    for name in names:
        results = EvalDir(out / name).load()
        out_values[name] = {c: results.values(c) for c in results.columns()}
    return out_values


def test_names_are_injective_and_a_repeated_checkpoint_is_refused(tmp_path: Path,
                                                                   capsys) -> None:
    names = evaluation_set_names(["a/run", "b/run", "b/run/", "builtin:demo-vicreg"])
    assert len(set(names)) == 4 and names[0].startswith("run-") and names[1].startswith("run-")
    assert names[3].startswith("builtin_demo-vicreg-")
    assert main(["eval", "x.pt", "x.pt", "--data", "builtin", "--out", str(tmp_path / "o")]) == 2
    assert "is given twice" in capsys.readouterr().err
    # a missing one is refused before anything is written or evaluated
    assert main(["eval", "builtin:demo-vicreg", str(tmp_path / "gone.pt"), "--data", "builtin",
                 "--out", str(tmp_path / "o")]) == 2
    assert "gone.pt: no such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # evaluations as jobs through submitit's local executor
def test_jobs_give_the_inline_numbers_and_a_second_run_submits_nothing(
        two: tuple[list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("submitit")
    checkpoints, data = two
    assert _eval(checkpoints, data, tmp_path / "inline") == 0
    printed = capsys.readouterr().out
    assert _eval(checkpoints, data, tmp_path / "local", "--executor", "local",
                 "--max-parallel", "2") == 0
    assert capsys.readouterr().out.replace("local", "inline") == printed  # what a user reads
    inline, local = _values(tmp_path / "inline"), _values(tmp_path / "local")
    assert inline == local and len(local) == 2
    assert inline[next(iter(inline))] != inline[list(inline)[1]]  # two models, two results
    jobs = json.loads((tmp_path / "local" / "jobs.json").read_text())
    assert sorted(jobs) == sorted(local) and {j["state"] for j in jobs.values()} == {"done"}
    assert all(j["pid"] != os.getpid() for j in jobs.values())  # processes of their own
    before = (tmp_path / "local" / "jobs.json").read_bytes()
    written = {n: EvalDir(tmp_path / "local" / n).results.read_bytes() for n in local}
    assert _eval(checkpoints, data, tmp_path / "local", "--executor", "local") == 0
    assert (tmp_path / "local" / "jobs.json").read_bytes() == before  # nothing submitted
    assert {n: EvalDir(tmp_path / "local" / n).results.read_bytes() for n in local} == written
    # other options: evaluated anew (a job each), never the old numbers under new options
    assert _eval(checkpoints, data, tmp_path / "local", "--executor", "local",
                 "--knn-k", "5") == 0
    assert all(EvalDir(tmp_path / "local" / n).load().columns() == ["linear 100%", "knn k=5"]
               for n in local)


@pytest.mark.slow  # evaluations as jobs through submitit's local executor
def test_a_failed_job_stops_with_its_log_tail(two: tuple[list[str], Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("submitit")
    checkpoints, data = two
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    assert _eval([checkpoints[0], str(broken)], data, tmp_path / "o", "--executor",
                 "local") == 1
    err = capsys.readouterr().err
    assert "--- last lines of" in err and "not a PyTorch checkpoint" in err
    assert "e2mc eval: error: job " in err and "broken.pt" in err and " failed: " in err
    jobs = json.loads((tmp_path / "o" / "jobs.json").read_text())
    assert "failed" in [j["state"] for j in jobs.values()]
    assert not any((tmp_path / "o" / n / "results.json").exists()
                   for n, j in jobs.items() if j["state"] == "failed")


def test_inline_set_and_a_directory_that_names_other_checkpoints(
        two: tuple[list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoints, data = two
    out = tmp_path / "o"
    assert _eval(checkpoints, data, out) == 0
    values = _values(out)
    single = tmp_path / "single"
    assert _eval(checkpoints[:1], data, single) == 0  # one checkpoint: --out is its directory
    first = next(iter(values))
    assert {c: EvalDir(single).load().values(c) for c in values[first]} == values[first]
    index = EvalSetDir(out).index
    record = json.loads(index.read_text())
    record["checkpoints"][first] = "somewhere/else.pt"
    index.write_text(json.dumps(record))
    capsys.readouterr()
    assert _eval(checkpoints, data, out) == 2
    assert "use another --out" in capsys.readouterr().err
    shutil.rmtree(out)
