"""``e2mc search`` under faults: a signal at every kind of write of a search and of a
confirmation (SIGKILL halfway through it, SIGTERM before it), and a pre-empted trial, then the
same command again: the numbers of the uninterrupted run, nothing left half-written."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import torch

from e2mc.artifacts import SEARCH_JSON
from e2mc.search import Trial
from helpers import child_processes, tiny_base
from test_search import _search, _spec


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_base(tmp_path_factory.mktemp("search-base"))


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
