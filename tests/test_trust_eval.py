"""Issue 22, items 7 and 8: an evaluation directory describes one model (written as one unit,
one writer at a time), and ``compare`` refuses what it cannot pair and says which rows have no
paired test."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import e2mc
import e2mc.files as ckio
from e2mc.artifacts import GENERATIONS, EvalDir, writer_lock
from e2mc.cli import main
from e2mc.evaluation.results import compare_evaluations, save_predictions
from e2mc.evaluation.runner import EvalOptions, run_evaluation
from helpers import recorded_data
from test_evaluation_cli import data
from test_faults import CHILDREN

BASE_CHECKPOINT = Path(e2mc.__file__).parent / "assets" / "demo_base_vicreg.pt"
OPTIONS = EvalOptions(protocols=("linear", "knn"), fractions=(1.0,), seeds=(0, 1),
                      linear_overrides={"epochs": 2, "batch_size": 32}, knn_k=(3,),
                      knn_weightings=("weighted",), num_workers=0, progress=False)


class Killed(BaseException):
    """The process dies here (nothing catches it, as nothing catches a SIGKILL)."""


def evaluate(out: Path, model_seed: int) -> Path:
    """A complete evaluation of a random 4 -> 6 linear backbone (``model_seed``) into ``out``."""
    torch.manual_seed(model_seed)
    run_evaluation(nn.Linear(4, 6), 6, data(60, 0), data(45, 1), out, OPTIONS, data_id="toy")
    return out


def described(out: Path) -> dict[tuple[str, int], tuple[float, np.ndarray]]:
    """``{(column, seed): (number in results.json, predictions)}``, after checking that the
    directory describes one model: every entry's predictions file is the one results.json
    records (its sha256) and gives the entry's number."""
    results = EvalDir(out).load()
    found = {}
    for e in results.entries:
        path = out / e.predictions
        assert e.predictions_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        predictions, labels = results.predictions(e)
        assert 100 * np.mean(predictions == labels) == pytest.approx(e.value)
        found[(e.column, e.seed)] = (e.value, predictions)
    return found


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key][0] == pytest.approx(b[key][0]) and np.array_equal(a[key][1], b[key][1])


def assert_no_leftovers(out: Path) -> None:
    """Only the files results.json references are in predictions/, no temporary file, no lock."""
    referenced = {e.predictions for e in EvalDir(out).load().entries}
    assert {f"predictions/{p.name}" for p in (out / "predictions").iterdir()} == referenced
    assert [p.name for p in out.glob(".*")] == [GENERATIONS]  # the record of its own files


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Uninterrupted evaluations of model 0 and model 1 (which differ)."""
    root = tmp_path_factory.mktemp("refs")
    refs = {seed: evaluate(root / f"model{seed}", seed) for seed in (0, 1)}
    a, b = described(refs[0]), described(refs[1])
    assert any(not np.array_equal(a[k][1], b[k][1]) for k in a)
    return refs


# ----------------------------------------------------------------------------- item 7
def test_rerun_killed_before_results_keeps_the_previous_evaluation(
        references: dict[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = shutil.copytree(references[0], tmp_path / "eval")
    copy = shutil.copytree(references[0], tmp_path / "copy")

    def killed(self, record):
        raise Killed

    monkeypatch.setattr(EvalDir, "write", killed)
    with pytest.raises(Killed):  # the re-run with another model dies before results.json
        evaluate(out, 1)
    monkeypatch.undo()
    assert_same(described(out), described(references[0]))
    comp = compare_evaluations([str(copy), str(out)], n_resamples=100)
    assert comp.tests and all(t["n10"] == t["n01"] == 0 and t["difference"] == 0
                              for t in comp.tests)
    assert all(mark == "" for _, _, mark in comp.cells["eval"].values())
    evaluate(out, 1)  # the complete re-run: the new model, and nothing of the old one
    assert_same(described(out), described(references[1]))
    assert_no_leftovers(out)


def test_killed_at_every_write_then_resumed(references: dict[int, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-run into a complete evaluation of model 0 with model 1, killed at the k-th write of
    the directory (halfway: the temporary file keeps half the bytes), for every k; and once
    after the last write (results.json replaced, the old files not removed yet). Every time,
    the directory describes exactly one of the two models, and the resumed run ends like an
    uninterrupted one."""
    original = ckio.atomic_write
    calls: list[Path] = []

    def counting(path, write, mode="wb"):
        calls.append(Path(path))
        return original(path, write, mode)

    monkeypatch.setattr(ckio, "atomic_write", counting)
    evaluate(tmp_path / "counted", 1)
    monkeypatch.undo()
    n = len(calls)
    # the record of its own generation, 3 predictions files, results.json, the record again
    assert [c.name for c in calls[:1] + calls[-2:]] == [GENERATIONS, "results.json",
                                                        GENERATIONS] and n == 6
    model0, model1 = described(references[0]), described(references[1])
    for k, when in [*((k, "during") for k in range(1, n + 1)), (n, "after")]:
        count = 0

        def dying(path, write, mode="wb", k=k, when=when):
            nonlocal count
            count += 1
            if count < k:
                return original(path, write, mode)
            if when == "after":
                original(path, write, mode)
                raise Killed
            buf = io.BytesIO() if "b" in mode else io.StringIO()
            write(buf)
            half = buf.getvalue()[: len(buf.getvalue()) // 2]
            tmp = Path(path).parent / f".{Path(path).name}.x1y2z3w4.tmp"
            tmp.write_bytes(half) if "b" in mode else tmp.write_text(half)
            raise Killed

        out = shutil.copytree(references[0], tmp_path / f"{when}-{k}")
        monkeypatch.setattr(ckio, "atomic_write", dying)
        with pytest.raises(Killed):
            evaluate(out, 1)
        monkeypatch.undo()
        # results.json is the 5th write: once it is replaced, the directory is model 1's
        assert_same(described(out), model1 if when == "after" or k > n - 1 else model0)
        evaluate(out, 1)  # resumed: the same command again
        assert_same(described(out), model1)
        assert_no_leftovers(out)


def test_predictions_that_results_json_does_not_describe_are_refused(
        references: dict[int, Path], tmp_path: Path) -> None:
    out = shutil.copytree(references[0], tmp_path / "eval")
    results = EvalDir(out).load()
    entry = results.entries[0]
    other = EvalDir(references[1]).load().entries[0]
    shutil.copyfile(references[1] / other.predictions, out / entry.predictions)
    with pytest.raises(ValueError, match="does not match results.json"):
        results.predictions(entry)
    assert main(["compare", str(references[0]), str(out), "--out", str(tmp_path / "c")]) == 2


def _hold_lock(root: str, release: str) -> None:
    with writer_lock(root):
        while not Path(release).exists():
            time.sleep(0.01)


def test_a_second_writer_is_refused_and_the_results_are_untouched(
        references: dict[int, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from e2mc.artifacts import DirectoryBusy

    assert CHILDREN is not None
    out = shutil.copytree(references[0], tmp_path / "eval")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    release = tmp_path / "release"
    holder = CHILDREN.Process(target=_hold_lock, args=(str(out), str(release)))
    holder.start()
    try:
        deadline = time.monotonic() + 600  # a hang, not a speed: any loaded machine is slower
        while not (out / ".e2mc.lock").is_file() or \
                f'"pid": {holder.pid}' not in (out / ".e2mc.lock").read_text():
            if time.monotonic() > deadline:
                pytest.fail("the child never took the directory's lock (600 s)")
            time.sleep(0.01)
        code = main(["eval", str(BASE_CHECKPOINT), "--data", "builtin",
                     "--protocol", "knn", "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("e2mc eval: error: ")
        assert f"pid {holder.pid}" in err
        with pytest.raises(DirectoryBusy, match=f"pid {holder.pid}"):
            evaluate(out, 1)
    finally:
        release.touch()
        holder.join(20)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    evaluate(out, 1)  # the lock is free again
    assert_same(described(out), described(references[1]))


# ----------------------------------------------------------------------------- item 8
def synthetic(root: Path, report: str = "last", seeds: tuple[int, ...] = (0, 1),
              fractions: tuple[float, ...] = (0.1,), right: int = 60) -> Path:
    """An evaluation directory of linear probes (100 test images; ``right`` + seed of them
    right at the last epoch, 10 more at the best), written through the package's writers."""
    labels = np.arange(100) % 2
    entries = []
    for fraction in fractions:
        for seed in seeds:
            last, best = right + seed, right + seed + 10
            shown = last if report == "last" else best
            predictions = np.where(np.arange(100) < shown, labels, 1 - labels)
            rel = save_predictions(root, f"linear_f{fraction:g}_s{seed}", predictions, labels)
            entries.append({"protocol": "linear", "column": f"linear {100 * fraction:g}%",
                            "fraction": fraction, "seed": seed, "primary": f"top1_{report}",
                            "metrics": {"top1_last": float(last), "top1_best": float(best)},
                            "predictions": rel})
    EvalDir(root).write({"reported_epoch": report, "fractions": list(fractions),
                         "seeds": list(seeds), "entries": entries,
                         **recorded_data(labels)})
    return root


def test_compare_refuses_a_last_and_a_best_report(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a, b = synthetic(tmp_path / "a", "last"), synthetic(tmp_path / "b", "best")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("e2mc compare: error: ")
    assert "report kind" in err and "last" in err and "best" in err
    assert "--allow-mismatch" in err
    assert not (tmp_path / "c" / "comparison.md").exists()
    # told to: each run shows its own number (a: last epoch 60, 61; b: best 70, 71), and the
    # table says which metric each row is, and that they differ
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--resamples", "50",
                 "--allow-mismatch"]) == 0
    md = (tmp_path / "c" / "comparison.md").read_text()
    assert "| a | 60.50 ± 0.50 |" in md and "| b | 70.50 ± 0.50" in md
    assert "linear 10%: top1_last (a), top1_best (b)" in md
    assert "report kind" in md and "--allow-mismatch" in md


def test_compare_refuses_other_seeds_fractions_or_primaries(tmp_path: Path) -> None:
    a = synthetic(tmp_path / "a")
    other_seeds = synthetic(tmp_path / "seeds", seeds=(0, 2))
    other_fractions = synthetic(tmp_path / "fractions", fractions=(0.1, 0.01))
    with pytest.raises(ValueError, match=r"label seeds of 'linear 10%' \(a: 0, 1; seeds: 0, 2\)"):
        compare_evaluations([str(a), str(other_seeds)], n_resamples=50)
    with pytest.raises(ValueError, match=r"fractions of linear \(a: 10%; fractions: 1%, 10%\)"):
        compare_evaluations([str(a), str(other_fractions)], n_resamples=50)
    record = json.loads((a / "results.json").read_text())
    for e in record["entries"]:
        e["primary"] = "top1_best"
    other_primary = tmp_path / "primary"
    shutil.copytree(a / "predictions", other_primary / "predictions")
    EvalDir(other_primary).write(record)  # same report kind recorded, another primary
    with pytest.raises(ValueError, match="primary metric of 'linear 10%'"):
        compare_evaluations([str(a), str(other_primary)], n_resamples=50)
    comp = compare_evaluations([str(a), str(other_seeds)], n_resamples=50, allow_mismatch=True)
    assert [t["seed"] for t in comp.tests] == [0]  # paired only where the seeds are common


def test_compare_says_which_rows_have_no_paired_test(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    a = synthetic(tmp_path / "a", seeds=(0, 1))
    b = synthetic(tmp_path / "b", seeds=(2, 3), right=90)  # far better, but no common seed
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--resamples", "50",
                 "--allow-mismatch"]) == 0
    assert capsys.readouterr().out.splitlines()[-2] == "b against a: no paired test (†)"
    out = (tmp_path / "c" / "comparison.md").read_text()
    row = next(line for line in out.splitlines() if line.startswith("| b |"))
    assert row == "| b | 92.50 ± 0.50 † |"
    assert "† no paired test (no common seed): b at linear 10%" in out
    comp = compare_evaluations([str(a), str(b)], n_resamples=50, allow_mismatch=True)
    assert comp.tests == [] and comp.untested == {"b": {"linear 10%": "no common seed"}}
    rows = (tmp_path / "c" / "comparison.csv").read_text().splitlines()
    assert rows[0] == "run,column,mean,se,marker,verdict,p,no_paired_test"
    assert rows[1:] == ["a,linear 10%,60.5000,0.5000,,,,reference",
                        "b,linear 10%,92.5000,0.5000,,,,no common seed"]


def test_compare_refuses_probes_trained_with_other_settings(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """The same column computed another way (another --method probe preset: another learning
    rate, weight decay and standardisation) is not a paired comparison of the models: refused,
    naming what differs; kNN's k list only says which columns exist."""
    def settings(lr: float, standardize: bool, ks: list[int]) -> dict:
        probe = {"epochs": 100, "lr": lr, "weight_decay": 1e-6, "standardize": standardize,
                 "lr_grid": []}
        return {"linear": {"10%": probe},
                "knn": {"k": ks, "temperature": 0.07, "similarity": "cosine"}}

    a, b = synthetic(tmp_path / "a"), synthetic(tmp_path / "b", right=70)
    for root, preset, lr, standardize, ks in ((a, "generic", 0.1, True, [20, 200]),
                                              (b, "vicreg", 0.02, False, [20])):
        record = json.loads((root / "results.json").read_text())
        record.update(method_preset=preset, settings=settings(lr, standardize, ks))
        EvalDir(root).write(record)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("e2mc compare: error: cannot pair b with a")
    assert ("probe preset, --method (a: generic; b: vicreg); settings of linear 10% (a: lr 0.1, "
            "standardize true; b: lr 0.02, standardize false)") in err
    assert "knn" not in err
    assert not (tmp_path / "c" / "comparison.md").exists()
    # the same settings (the k list aside): compared
    record = json.loads((b / "results.json").read_text())
    record.update(method_preset="generic", settings=settings(0.1, True, [20]))
    EvalDir(b).write(record)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--resamples",
                 "50"]) == 0
