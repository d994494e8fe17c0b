"""``e2mc search``: paired trials on a validation split, the declared rule, resuming, refusals."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from e2mc.artifacts import SEARCH_JSON
from e2mc.cli import main
from e2mc.search import Trial, file_trials, grid_trials, select
from helpers import TINY_RUN, child_processes, recorded_test_data, tiny_base

TINY = [*TINY_RUN, "monitor.every=2", "monitor.probe_epochs=2", "monitor.knn_k=3"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_base(tmp_path_factory.mktemp("search-base"))


def _search(base: tuple[Path, Path], out: Path, *extra: str) -> int:
    ckpt, data = base
    sets = [a for item in TINY for a in ("--set", item)]
    return main(["search", "--config", "fmnist-vicreg-continue-e2mc", "--from", str(ckpt),
                 "--data", str(data), "--out", str(out), "--metric", "val/knn", *sets, *extra])


def test_grid_and_file_trials(tmp_path: Path) -> None:
    trials = grid_trials(["optim.base_lr=0.1,0.01", "training.epochs=1,2"])
    assert [t.overrides for t in trials] == [
        ["optim.base_lr=0.1", "training.epochs=1"], ["optim.base_lr=0.1", "training.epochs=2"],
        ["optim.base_lr=0.01", "training.epochs=1"], ["optim.base_lr=0.01", "training.epochs=2"]]
    listed = tmp_path / "trials.yaml"
    listed.write_text("- {name: small, set: {addon.params.beta: 10}}\n"
                      "- {optim.base_lr: 0.5}\n")
    assert [(t.name, t.overrides) for t in file_trials(listed)] == [
        ("small", ["addon.params.beta=10"]), ("optim.base_lr=0.5", ["optim.base_lr=0.5"])]
    assert Trial("b", ["addon.params.beta=1", "optim.base_lr=2"]).control_overrides == [
        "optim.base_lr=2"]


def test_the_rule_selects_the_largest_positive_difference_or_nothing() -> None:
    rows = [{"name": "a", "difference": 0.5}, {"name": "b", "difference": 1.5},
            {"name": "c", "difference": None}]
    assert select(rows) == "b"
    assert select([{"name": "a", "difference": 0.0}, {"name": "b", "difference": -1.0}]) is None
    assert select([]) is None
    # float32 rounding of two equal accuracies is a tie, won by the earlier trial
    tied = [{"name": "lr 0.001", "difference": 0.1999974}, {"name": "lr 0.01",
            "difference": 0.2000014}, {"name": "lr 0.1", "difference": -0.47}]
    assert select(tied) == "lr 0.001"
    assert select([{"name": "a", "difference": 0.2}, {"name": "b", "difference": 0.21}]) == "b"
    assert select([{"name": "a", "difference": 5e-5}]) is None  # zero up to rounding


def test_search_with_no_winner_selects_nothing_and_resumes(base: tuple[Path, Path],
                                                           tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "search"
    # beta = gamma = 0: the add-on adds nothing, so each trial trains exactly like its control
    assert _search(base, out, "--grid", "addon.params.beta=0", "--grid",
                   "addon.params.gamma=0") == 0
    record = json.loads((out / SEARCH_JSON).read_text())
    (row,) = record["trials"]
    assert row["difference"] == 0.0 and record["selected"] is None
    assert "trial minus its control" in record["spec"]["rule"]
    assert [p[0] for p in row["trajectory"]] == [0, 2, 4]
    err = capsys.readouterr().err
    assert "nothing selected" in err
    assert "  train trial (add-on e2mc): " in err
    assert "  train control: the same run without the add-on (add-on none): " in err
    # even with nothing selected: the table of every trial against its control, and the paths
    assert "| trial | steps | start | control | trial | difference |" in err
    assert f"| {row['name']} | 4 |" in err and "+0.00 |" in err
    assert f"the search's table and rule: {out / 'search.md'}" in err
    assert "No trial beat its control" in (out / "search.md").read_text()
    assert (out / "search.png").stat().st_size > 0
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")}
    assert len(stamps) == 2  # the trial and its control
    assert _search(base, out, "--grid", "addon.params.beta=0", "--grid",
                   "addon.params.gamma=0") == 0
    assert "train " not in capsys.readouterr().err  # nothing re-run
    assert {p: p.stat().st_mtime_ns for p in out.rglob("checkpoint.pt")} == stamps


def test_search_refuses_another_base_an_unknown_key_and_metric(base: tuple[Path, Path],
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    ckpt, data = base
    out = tmp_path / "s"
    out.mkdir()
    (out / SEARCH_JSON).write_text(json.dumps({"spec": {"checkpoint_sha256": "0" * 64}}))
    assert _search(base, out, "--grid", "addon.params.beta=0") == 2
    assert "another" in capsys.readouterr().err
    assert _search(base, tmp_path / "k", "--grid", "optim.base_rate=0.1") == 2
    assert "optim.base_rate" in capsys.readouterr().err
    assert _search(base, tmp_path / "p", "--grid", "addon.params.betta=1") == 2
    assert "no 'betta'" in capsys.readouterr().err
    assert _search(base, tmp_path / "m", "--grid", "addon.params.beta=0", "--metric",
                   "val/acc") == 2
    assert "unknown monitor metric" in capsys.readouterr().err


def _eval_dir(root: Path, correct: np.ndarray, seeds: tuple[int, ...]) -> Path:
    from e2mc.artifacts import EvalDir
    from e2mc.evaluation.results import save_predictions

    labels = np.zeros(len(correct), dtype=np.int64)
    entries = []
    for seed in seeds:
        rel = save_predictions(root, f"linear_1_s{seed}", np.where(correct, 0, 1), labels)
        entries.append({"protocol": "linear", "column": "linear 1%", "fraction": 0.01,
                        "seed": seed, "primary": "top1",
                        "metrics": {"top1": 100 * correct.mean()}, "predictions": rel})
    EvalDir(root).write({"entries": entries, "test_data": recorded_test_data(labels)})
    return root


def test_confirmation_pairs_each_seed_and_pools(tmp_path: Path) -> None:
    from e2mc.search import confirm_markdown, confirmation

    control = np.arange(200) < 100  # right on 100 of 200 test images
    better = np.arange(200) < 140  # the same 100 and 40 more
    pairs = [(s, _eval_dir(tmp_path / f"c{s}", control, (0, 1)),
              _eval_dir(tmp_path / f"t{s}", better, (0, 1))) for s in (0, 1)]
    result = confirmation(pairs, "lr 0.1")
    col = result["columns"]["linear 1%"]
    assert col["difference"]["mean"] == pytest.approx(20.0) and col["difference"]["se"] == 0
    assert (col["pairs"], col["significant_better"], col["significant_worse"]) == (4, 4, 0)
    assert col["pooled_p"] < 0.001
    assert "| linear 1% | +20.00 ± 0.00 | 4/4 | 0/4 |" in confirm_markdown(result)


def test_confirm_trains_each_seed_and_tests_on_the_test_split(base: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    from e2mc.artifacts import SearchDir
    from e2mc.files import sha256_file
    from e2mc.search import Search, SearchSpec

    ckpt, data = base
    spec = SearchSpec(config="fmnist-vicreg-continue-e2mc", checkpoint=str(ckpt),
                      checkpoint_sha256=sha256_file(ckpt), data=str(data), val_split=0.2,
                      seed=0, metric="val/knn", common=TINY,
                      trials=[Trial("beta 1", ["addon.params.beta=1"])])
    search = Search(spec, tmp_path / "s", log=lambda _m: None)
    result = search.confirm([0, 1], {"selected": "beta 1"}, eval_fractions=(0.5, 1.0),
                            label_seeds=(0,), probe_epochs=2)
    assert result is not None and result["seeds"] == [0, 1]
    assert set(result["columns"]) == {"linear 50%", "linear 100%", "knn k=20"}
    assert all(c["pairs"] == 2 for c in result["columns"].values())
    files = SearchDir(tmp_path / "s")
    assert files.confirm_markdown.is_file() and files.confirm_json.is_file()
    for seed in (0, 1):
        for kind in ("run", "control"):
            assert files.confirm_run(seed, kind).checkpoint.is_file()
            assert files.confirm_eval(seed, kind).exists()
    assert search.confirm([0], {"selected": None}) is None  # nothing selected: nothing to do


# --------------------------------------------------------------------------- trust (issue 22)
def _spec(base: tuple[Path, Path], trials: list[Trial], *common: str):
    from e2mc.files import sha256_file
    from e2mc.search import SearchSpec

    ckpt, data = base
    return SearchSpec(config="fmnist-vicreg-continue-e2mc", checkpoint=str(ckpt),
                      checkpoint_sha256=sha256_file(ckpt), data=str(data), val_split=0.2,
                      seed=0, metric="val/knn", common=[*TINY, *common], trials=trials)


def test_trial_directories_are_injective_and_same_settings_are_refused(
        base: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from e2mc.search import Search

    # two names with one slug, different settings: two directories
    named = [Trial("beta 100", ["addon.params.beta=100"]),
             Trial("beta_100", ["addon.params.beta=10"])]
    search = Search(_spec(base, named), tmp_path / "a", log=lambda _m: None)
    assert len({search.run_dirs(t)[0].root for t in named}) == 2
    # a 5-axis grid of 32 trials (long keys, names past any cut): 32 trial directories and
    # one control per point of the axes that do not configure the add-on
    grid = grid_trials(["addon.params.beta=1,2", "addon.params.gamma=1,2",
                        "optim.base_lr=0.01,0.02", "optim.weight_decay=0.0001,0.0002",
                        "optim.warmup_epochs=0,0.5"])
    search = Search(_spec(base, grid), tmp_path / "b", log=lambda _m: None)
    dirs = [search.run_dirs(t) for t in grid]
    assert len({r.root for r, _ in dirs}) == 32 and len({c.root for _, c in dirs}) == 8
    # the same settings twice (another spelling of 0.1), or one name twice: refused, exit 2
    listed = tmp_path / "same.yaml"
    listed.write_text("- {name: a, set: {optim.base_lr: 0.1}}\n"
                      "- {name: b, set: {optim.base_lr: 0.10}}\n")
    assert _search(base, tmp_path / "c", "--trials", str(listed)) == 2
    assert "trials 'a' and 'b' have the same settings" in capsys.readouterr().err
    listed.write_text("- {name: a, set: {optim.base_lr: 0.1}}\n"
                      "- {name: a, set: {optim.base_lr: 0.2}}\n")
    assert _search(base, tmp_path / "d", "--trials", str(listed)) == 2
    assert "'a' is used more than once" in capsys.readouterr().err


@pytest.fixture(scope="module")
def reference_search(base: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[Path, list[str]]:
    """An uninterrupted two-epoch search of one trial: its directory, and the relative path
    of every file it wrote through the atomic writer, in order."""
    import e2mc.files as ckio

    out = tmp_path_factory.mktemp("reference-search") / "s"
    writes: list[str] = []
    original = ckio.atomic_write

    def counting(path, write, mode="wb"):
        writes.append(Path(path).relative_to(out).as_posix())
        return original(path, write, mode)

    ckio.atomic_write = counting
    try:
        assert _search(base, out, "--grid", "addon.params.beta=1",
                       "--set", "training.epochs=2") == 0
    finally:
        ckio.atomic_write = original
    return out, writes


def _same_search(out: Path, reference: Path) -> None:
    """The trials of the two searches' records agree, number for number."""
    a = json.loads((reference / SEARCH_JSON).read_text())
    b = json.loads((out / SEARCH_JSON).read_text())
    keys = ("name", "trajectory", "control_trajectory", "value", "control_value",
            "difference", "steps")
    assert [{k: t[k] for k in keys} for t in b["trials"]] == \
        [{k: t[k] for k in keys} for t in a["trials"]]
    assert b["selected"] == a["selected"]
    assert [p.name for p in out.rglob("*.tmp")] == [] and not list(out.rglob(".e2mc.lock"))


def test_a_preempted_trial_is_resumed_not_counted(
        base: tuple[Path, Path], reference_search: tuple[Path, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import signal

    from e2mc.artifacts import RunDir
    from e2mc.training.preemption import PreemptionCallback

    ref, _ = reference_search
    original = PreemptionCallback.on_step_end
    sent: list[int] = []

    def sigterm_after_step_3(self, trainer, step, run_epoch, terms):
        if step == 3 and not sent:
            sent.append(step)
            signal.raise_signal(signal.SIGTERM)
        return original(self, trainer, step, run_epoch, terms)

    monkeypatch.setattr(PreemptionCallback, "on_step_end", sigterm_after_step_3)
    out = tmp_path / "s"
    args = ("--grid", "addon.params.beta=1", "--set", "training.epochs=2")
    assert _search(base, out, *args) == 75  # pre-empted, not done
    assert "search pre-empted" in capsys.readouterr().err
    (trial,) = [RunDir(p.parent) for p in (out / "trials").glob("*/run/checkpoint.pt")]
    assert not trial.is_done() and not trial.done.exists()
    assert torch.load(trial.checkpoint, weights_only=True)["step"] == 3
    assert json.loads((out / SEARCH_JSON).read_text())["trials"] == []  # nothing compared
    assert _search(base, out, *args) == 0  # resumes the trial from step 3, then its control
    assert "resuming from" in capsys.readouterr().err
    assert json.loads(trial.done.read_text())["step"] == 8
    _same_search(out, ref)


def _killed_during_write(work, suffix: str, nth: int = 1, sig: int = 9,
                         under: str | None = None) -> int:
    """``work()`` (an exit code; picklable, e.g. a ``functools.partial``) in a child process
    (:func:`helpers.child_processes`) that gets ``sig`` during the ``nth`` atomic write of a
    path ending with ``suffix`` (and, with ``under``, whose path relative to ``under`` starts
    with ``confirm``): SIGKILL halfway through the write, any other signal before it (recorded
    by a handler; the write goes on). The child's exit code (-9 when a SIGKILL landed)."""
    ctx = child_processes()
    assert ctx is not None
    proc = ctx.Process(target=_child_killed_during_write, args=(work, suffix, nth, sig, under))
    proc.start()
    proc.join(120)
    return proc.exitcode


def _child_killed_during_write(work, suffix: str, nth: int, sig: int, under: str | None) -> None:
    import signal

    import e2mc.files as files

    original, seen = files.atomic_write, [0]

    def matches(path: str) -> bool:
        return path.endswith(suffix) and (
            under is None or os.path.relpath(path, under).startswith("confirm"))

    def killing(path, write, mode="wb"):
        if matches(str(path)):
            seen[0] += 1
            if seen[0] == nth and sig != signal.SIGKILL:
                os.kill(os.getpid(), sig)
            elif seen[0] == nth:
                def half(f):
                    f.write(b"\0" if "b" in mode else "{")
                    f.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(path, half, mode)
        return original(path, write, mode)

    files.atomic_write = killing
    os._exit(work())


def _search_killed(base: tuple[Path, Path], out: Path, target: str, nth: int,
                   sig: int = 9) -> int:
    """The one-trial two-epoch search, given ``sig`` during the ``nth`` write of a file ending
    with ``target`` (:func:`_killed_during_write`)."""
    return _killed_during_write(
        functools.partial(_search, base, out, "--grid", "addon.params.beta=1", "--set",
                          "training.epochs=2"), target, nth, sig)


#: Every file a search writes through the atomic writer (the reference search's writes by name;
#: a test below fails when a new kind appears, so that it gets its kill scenario here).
SEARCH_WRITES = ["search.json", "val_split.json", "config.yaml", "start.json", "checkpoint.pt",
                 "monitor.png", "done.json", "search.md", "search.png"]


def test_every_kind_of_search_write_has_its_kill_scenario(
        reference_search: tuple[Path, list[str]]) -> None:
    _, writes = reference_search
    names = list(dict.fromkeys(Path(w).name for w in writes))
    assert sorted(names) == sorted(SEARCH_WRITES)
    assert any(w.startswith("trials/control-") and w.endswith("checkpoint.pt")
               and "/run/" not in w for w in writes)  # the control's own run files


def _kill_scenarios() -> list:
    """``(file, nth write, signal)``: SIGKILL during the first write of every kind of file, a
    trial's second checkpoint write (the control's first: ``nth`` is counted at run time) and
    the second done marker; SIGTERM (a pre-emption) during a trial's checkpoint write, the
    first done marker and the first search.json."""
    import signal

    kill, term = signal.SIGKILL, signal.SIGTERM
    return ([pytest.param(n, 1, kill, id=f"kill-{n}") for n in SEARCH_WRITES]
            + [pytest.param("checkpoint.pt", "control", kill, id="kill-control-checkpoint"),
               pytest.param("done.json", 2, kill, id="kill-second-done"),
               pytest.param("checkpoint.pt", 2, term, id="term-checkpoint"),
               pytest.param("done.json", 1, term, id="term-done"),
               pytest.param("search.json", 1, term, id="term-search-json")])


@pytest.mark.slow  # a killed and a resumed search each: about 10 s on 2 cores
@pytest.mark.skipif(child_processes() is None, reason="needs forkserver (POSIX)")
@pytest.mark.parametrize("target,nth,sig", _kill_scenarios())
def test_a_search_killed_at_every_kind_of_write_resumes_to_the_same_numbers(
        base: tuple[Path, Path], reference_search: tuple[Path, list[str]],
        tmp_path: Path, target: str, nth: int | str, sig: int) -> None:
    """A signal during a write of a file a search writes (SIGKILL halfway through it, SIGTERM
    before it), then the same command again: the same search.json numbers as the uninterrupted
    search, no temporary file, no lock left; a pre-empted search exits 75 (or 0 when it had
    nothing left to do)."""
    import signal

    ref, writes = reference_search
    if nth == "control":  # the first write of the control's checkpoint, after the trial's
        nth = sum(1 for w in writes if w.endswith("/run/checkpoint.pt")) + 1
    out = tmp_path / "s"
    code = _search_killed(base, out, target, int(nth), sig)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 75), (target, nth, code)
    assert _search(base, out, "--grid", "addon.params.beta=1",
                   "--set", "training.epochs=2") == 0, (target, nth)
    _same_search(out, ref)


def _run_and_confirm(base: tuple[Path, Path], out: Path) -> int:
    """What ``e2mc search --confirm 0`` does after selecting "beta 1" (with probes small enough
    for the tiny data): 0 when done, 75 when pre-empted."""
    from e2mc.search import Search, SearchPreempted
    from e2mc.training.preemption import PreemptionHandler

    search = Search(_spec(base, [Trial("beta 1", ["addon.params.beta=1"])]), out,
                    log=lambda _m: None)
    with PreemptionHandler() as signals:
        search.stop_on(lambda: signals.requested)
        try:
            search.confirm([0], {"selected": "beta 1"}, eval_fractions=(0.5, 1.0),
                           label_seeds=(0,), probe_epochs=2)
        except SearchPreempted:
            return 75
    return 0


def _confirm_killed(base: tuple[Path, Path], out: Path, target: str, sig: int) -> int:
    """:func:`_run_and_confirm`, given ``sig`` during the first write of a confirmation file
    ending with ``target`` (:func:`_killed_during_write`)."""
    return _killed_during_write(functools.partial(_run_and_confirm, base, out), target, 1, sig,
                                under=str(out))


@pytest.fixture(scope="module")
def reference_confirmation(base: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
                           ) -> dict:
    """confirm.json of an uninterrupted confirmation."""
    from e2mc.artifacts import SearchDir

    ref = tmp_path_factory.mktemp("reference-confirmation") / "ref"
    assert _run_and_confirm(base, ref) == 0
    return json.loads(SearchDir(ref).confirm_json.read_text())


def _confirm_scenarios() -> list:
    import signal

    kill, term = signal.SIGKILL, signal.SIGTERM
    return ([pytest.param(t, kill, id=f"kill-{t}") for t in ("checkpoint.pt", "done.json",
                                                             ".npz", "results.json",
                                                             "confirm.json", "confirm.md")]
            + [pytest.param(t, term, id=f"term-{t}") for t in ("checkpoint.pt",
                                                               "results.json")])


@pytest.mark.slow  # a killed and a resumed confirmation each: about 10 s on 2 cores
@pytest.mark.skipif(child_processes() is None, reason="needs forkserver (POSIX)")
@pytest.mark.parametrize("target,sig", _confirm_scenarios())
def test_a_confirmation_killed_at_every_kind_of_write_resumes_to_the_same_numbers(
        base: tuple[Path, Path], reference_confirmation: dict, tmp_path: Path, target: str,
        sig: int) -> None:
    """SIGKILL during the first write of each file of a confirmation (its runs' checkpoints and
    done markers, its evaluations' predictions and results.json, confirm.json and confirm.md)
    and SIGTERM during a run's checkpoint and an evaluation's results.json, then the same
    search again: the same confirm.json as an uninterrupted one; every evaluation directory
    describes one model."""
    import signal

    from e2mc.artifacts import EvalDir, SearchDir

    out = tmp_path / "k"
    code = _confirm_killed(base, out, target, sig)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 75), (target, sig, code)
    assert _run_and_confirm(base, out) == 0, (target, sig)
    assert json.loads(SearchDir(out).confirm_json.read_text()) == reference_confirmation
    for kind in ("run", "control"):
        results = EvalDir(out / "confirm" / "seed0" / f"{kind}-eval").load()
        for entry in results.entries:  # each predictions file is the one results.json names
            results.predictions(entry)
    assert [p.name for p in out.rglob("*.tmp")] == [] and not list(out.rglob(".e2mc.lock"))


def test_controls_that_trained_the_same_are_one_line_named_after_their_trials() -> None:
    from e2mc.search.report import control_lines

    same, other = [[0, 50.0], [2, 51.0]], [[0, 50.0], [2, 49.5]]
    record = {"trials": [{"name": "b1", "control_trajectory": same},
                         {"name": "b2", "control_trajectory": same},
                         {"name": "lr", "control_trajectory": other},
                         {"name": "x", "control_trajectory": []}]}
    assert control_lines(record) == [(["b1", "b2"], [(0.0, 50.0), (2.0, 51.0)]),
                                     (["lr"], [(0.0, 50.0), (2.0, 49.5)])]
