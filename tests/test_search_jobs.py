"""``e2mc search --executor local|slurm`` (e2mc.jobs): every run as a job of its own through
submitit, the same numbers as the inline search, resuming, failures, the SLURM script."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from e2mc.artifacts import SEARCH_JSON, RunDir
from e2mc.cli import main
from helpers import TINY_RUN, fake_slurm_commands, tiny_base

submitit = pytest.importorskip("submitit")

TINY = [*TINY_RUN, "monitor.every=4", "monitor.probe_epochs=2", "monitor.knn_k=3",
        "training.epochs=2"]
GRID = ("--grid", "addon.params.beta=1,10")  # two trials sharing one control: three runs
LOCAL = ("--executor", "local", "--max-parallel", "2")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_base(tmp_path_factory.mktemp("jobs-base"))


def _search(base: tuple[Path, Path], out: Path, *extra: str, data: Path | None = None,
            grid: tuple[str, ...] = GRID) -> int:
    ckpt, default_data = base
    sets = [a for item in TINY for a in ("--set", item)]
    return main(["search", "--config", "fmnist-vicreg-e2mc", "--from", str(ckpt),
                 "--data", str(data or default_data), "--out", str(out), "--metric", "val/knn",
                 *sets, *grid, *extra])


def _numbers(out: Path) -> tuple[list[dict], str | None]:
    record = json.loads((out / SEARCH_JSON).read_text())
    keys = ("name", "trajectory", "control_trajectory", "value", "control_value",
            "difference", "steps")
    return [{k: t[k] for k in keys} for t in record["trials"]], record["selected"]


def _jobs(out: Path) -> dict[str, dict]:
    return json.loads((out / "jobs.json").read_text())


@pytest.fixture(scope="module")
def searches(base: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, Path]:
    """The same search inline and through the local executor (its 3 jobs at once)."""
    root = tmp_path_factory.mktemp("jobs-searches")
    assert _search(base, root / "inline") == 0
    assert _search(base, root / "local", "--executor", "local", "--max-parallel", "3") == 0
    return root / "inline", root / "local"


@pytest.mark.slow  # searches through submitit's local executor
def test_local_jobs_run_apart_and_give_the_inline_numbers(searches: tuple[Path, Path]) -> None:
    inline, local = searches
    assert _numbers(local) == _numbers(inline)
    assert _numbers(local)[0] and len(_numbers(local)[0]) == 2
    jobs = _jobs(local)
    assert sorted(jobs) == sorted(p.relative_to(local).parent.as_posix()
                                  for p in local.glob("trials/**/done.json"))
    assert len(jobs) == 3 and all(j["state"] == "done" and j["executor"] == "local"
                                  for j in jobs.values())
    pids = {j["pid"] for j in jobs.values()}
    assert len(pids) == 3 and os.getpid() not in pids  # each run in a process of its own
    assert all(Path(j["log"]).is_file() for j in jobs.values())
    assert not list(local.rglob(".e2mc.lock")) and not list(local.rglob("*.tmp"))
    # the runs' warnings, which went to the jobs' logs, are the inline search's, in search.md
    warned = [json.loads((out / SEARCH_JSON).read_text())["warnings"] for out in searches]
    assert warned[0] == warned[1] and len(warned[1]) == 2
    assert warned[1][0]["text"] in (local / "search.md").read_text().replace("\\", "")


@pytest.mark.slow  # searches through submitit's local executor
def test_a_resumed_search_resubmits_nothing_that_finished(
        base: tuple[Path, Path], searches: tuple[Path, Path],
        capsys: pytest.CaptureFixture) -> None:
    _, local = searches
    before, files = _jobs(local), sorted(p.name for p in (local / "jobs").iterdir())
    capsys.readouterr()
    assert _search(base, local, "--executor", "local") == 0
    err = capsys.readouterr().err
    assert "  job " not in err and "read (done)" in err
    assert _jobs(local) == before
    assert sorted(p.name for p in (local / "jobs").iterdir()) == files


_KILLER = '''
import os
if os.environ.get("SUBMITIT_LOCAL_JOB_ID") and os.environ.get("E2MC_TEST_KILL"):
    import signal
    import e2mc.files as files
    target, mark = os.environ["E2MC_TEST_KILL"].split(os.pathsep)
    original = files.atomic_write

    def atomic_write(path, write, mode="wb"):
        original(path, write, mode)
        if str(path).endswith("checkpoint.pt") and target in str(path) \\
                and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    files.atomic_write = atomic_write
'''


@pytest.mark.slow  # searches through submitit's local executor
def test_a_killed_job_resumes_when_the_search_runs_again(
        base: tuple[Path, Path], searches: tuple[Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """SIGKILL of a job right after its run's first checkpoint (a sitecustomize in the job
    processes only, set up by this test): the search stops (75); run again, it resubmits that
    run alone, which resumes from its checkpoint, and the numbers are the inline search's
    (this search is the inline one's second trial with its control)."""
    inline, _ = searches
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_KILLER)
    mark = tmp_path / "killed"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("E2MC_TEST_KILL", os.pathsep.join(["beta_10-", str(mark)]))
    out = tmp_path / "s"
    one = ("--grid", "addon.params.beta=10")
    assert _search(base, out, *LOCAL, grid=one) == 75
    err = capsys.readouterr().err
    assert mark.is_file() and "ended without a result" in err
    (killed,) = [k for k in _jobs(out) if "beta_10-" in k]
    run = RunDir(out / killed)
    assert not run.is_done() and torch.load(run.checkpoint, weights_only=True)["step"] == 4
    first = _jobs(out)
    assert _search(base, out, *LOCAL, grid=one) == 0
    assert "resuming from" in Path(_jobs(out)[killed]["log"]).read_text()
    from e2mc.search import select

    rows = [_numbers(inline)[0][1]]  # the inline search's beta=10 trial and its control
    assert _numbers(out) == (rows, select(rows))
    again = _jobs(out)
    assert again[killed]["earlier"] == [first[killed]["job_id"]]
    for key, entry in first.items():  # what had finished was not submitted again
        if entry["state"] == "done":
            assert again[key]["job_id"] == entry["job_id"]


@pytest.mark.slow  # searches through submitit's local executor
def test_a_failed_job_stops_the_search_with_its_log_tail(
        base: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "s"
    broken = tmp_path / "broken.pt"  # every job fails reading its starting checkpoint (the
    broken.write_bytes(b"not a checkpoint")  # search hashes it; the job is the first to load it)
    assert _search((broken, base[1]), out, "--executor", "local", "--max-parallel", "1") == 1
    err = capsys.readouterr().err
    assert "--- last lines of" in err and "broken.pt" in err
    assert "e2mc search: error: job " in err and " failed: " in err
    assert "1 failed" in err
    record = json.loads((out / SEARCH_JSON).read_text())
    assert record["trials"] == [] and record["selected"] is None  # nothing on partial data
    assert [j["state"] for j in _jobs(out).values()] == ["failed"]


def test_executor_options_are_checked_before_anything_runs(
        base: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    assert _search(base, tmp_path / "a", "--executor", "local", "--partition", "gpu") == 2
    assert "--partition only apply to --executor slurm" in capsys.readouterr().err
    assert _search(base, tmp_path / "b", "--max-parallel", "2") == 2
    assert "only apply to --executor local or slurm" in capsys.readouterr().err
    assert _search(base, tmp_path / "c", "--executor", "local", "--slurm", "qos=") == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "submitit", None)  # not installed
    assert _search(base, tmp_path / "d", "--executor", "slurm") == 2
    assert "pip install 'e2mc[cluster]'" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_the_slurm_job_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sbatch script submitit would submit (not submitted: no SLURM here): one task per GPU
    on each node, the GPUs, submitit's signal ahead of the time limit, requeueing, logs
    appended across requeues, and the partition, time, account and extra settings."""
    from submitit.slurm.slurm import _make_sbatch_string

    from e2mc.jobs import ExecutorOptions, make_executor, parse_slurm_settings, slurm_parameters

    fake_slurm_commands(monkeypatch, tmp_path)
    options = ExecutorOptions(kind="slurm", partition="gpu", nodes=2, gpus_per_node=4,
                              cpus_per_task=10, time_min=120, account="proj",
                              constraint="a100", max_parallel=3,
                              slurm=parse_slurm_settings(["qos=high", "exclusive"]))
    options.check()
    executor = make_executor(options, tmp_path, "e2mc-search")
    lines = executor._make_submission_file_text(executor._submitit_command_str, "x").splitlines()
    for expected in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4",
                     "--cpus-per-task=10", "--signal=USR2@300", "--requeue",
                     "--open-mode=append", "--partition=gpu", "--time=120", "--account=proj",
                     "--constraint=a100", "--qos=high", "--exclusive", "--job-name=e2mc-search"):
        assert f"#SBATCH {expected}" in lines, expected
    assert any(ln.startswith("srun ") and "submitit.core._submit" in ln for ln in lines)
    # evaluations: one task on one GPU; several jobs at once: an array, 3 running at a time
    evaluation = make_executor(options, tmp_path, "e2mc-search", kind="eval")
    text = evaluation._make_submission_file_text("python", "x")
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --gpus-per-node=1" in text
    assert "#SBATCH --nodes=1" in text
    array = _make_sbatch_string(command="python", folder=tmp_path, map_count=12,
                                **slurm_parameters(options, "e2mc-search"))
    assert "#SBATCH --array=0-11%3" in array


def test_a_slurm_task_joins_the_process_group_as_under_torchrun(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Task 3 of a 2-node job with 4 tasks per node: submitit's environment gives the
    variables torchrun would set, which the trainer's init_runtime reads."""
    from e2mc.jobs.work import _join_process_group

    for name, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_NTASKS": "8",
                        "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "3",
                        "SLURM_LOCALID": "3", "SLURM_JOB_NODELIST": "gpu[12-13]"}.items():
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, "-")  # (so that the test's end restores them)
        monkeypatch.delenv(name)
    _join_process_group()
    assert (os.environ["MASTER_ADDR"], os.environ["RANK"], os.environ["WORLD_SIZE"],
            os.environ["LOCAL_RANK"], os.environ["CUDA_VISIBLE_DEVICES"]) == \
        ("gpu12", "3", "8", "3", "3")
    assert 20000 <= int(os.environ["MASTER_PORT"]) <= 60000


def test_submitits_signal_takes_the_trainers_preemption_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In a job, submitit's time-limit signal (USR2) is raised again as the trainer's first
    pre-emption signal, so the trainer checkpoints after its step and stops, and the stop
    requeues (a time limit), where a plain SIGTERM (scancel) does not. submitit's own handler
    (which would requeue at once, racing the checkpoint) is not put back afterwards."""
    from e2mc.jobs.work import _signals_to_trainer
    from e2mc.training import preemption
    from e2mc.training.preemption import PreemptionHandler, wants_requeue

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setattr(preemption, "_TIME_LIMIT_AHEAD", [False])
    before = signal.signal(signal.SIGUSR2, lambda *_: pytest.fail("submitit's handler ran"))
    try:
        assert not wants_requeue(signal.SIGTERM) and not wants_requeue(signal.SIGHUP)
        with _signals_to_trainer(["SIGTERM", "SIGUSR1"]):
            trainer = PreemptionHandler(["SIGTERM", "SIGUSR1"]).install()  # as the trainer does
            signal.raise_signal(signal.SIGUSR2)
            assert trainer.received == signal.SIGUSR1 and wants_requeue(signal.SIGTERM)
            trainer.uninstall()
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        signal.raise_signal(signal.SIGUSR2)  # a late one: ignored
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_jobs_in_flight_at_once_and_a_line_a_minute_on_what_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-parallel`` by default: one local job at a time on the CPU (each trains with all
    the cores), as many as the GPUs hold with ``--gpus-per-node``, all on SLURM. Without a
    terminal the jobs' counts are a line when one changes, and every minute one saying what
    runs, for how long (a fake clock)."""
    import time
    from types import SimpleNamespace

    from e2mc.jobs import ExecutorOptions
    from e2mc.jobs.runner import _Progress

    assert ExecutorOptions(kind="local").parallel(3) == 1
    assert ExecutorOptions(kind="local", max_parallel=2).parallel(3) == 2
    assert ExecutorOptions(kind="slurm").parallel(3) == 3
    assert ExecutorOptions(kind="slurm", max_parallel=2).parallel(3) == 2
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 5)
    assert ExecutorOptions(kind="local", gpus_per_node=2).parallel(4) == 2
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    lines: list[str] = []
    progress = _Progress(3, 1, lines.append)
    job = SimpleNamespace(work=SimpleNamespace(key="trials/a/run"), started=1000.0)
    for _ in range(3):
        progress.show(1, [job], 1)
        now[0] += 30
    progress.show(0, [job], 2)
    assert lines == ["jobs: 1 queued, 1 running (trials/a/run 0 min), 1 done, 0 failed (of 3)",
                     "jobs: 1 queued, 1 running (trials/a/run 1 min), 1 done, 0 failed (of 3)",
                     "jobs: 0 queued, 1 running (trials/a/run 2 min), 2 done, 0 failed (of 3)"]


def test_on_a_terminal_the_jobs_bar_moves_at_every_look(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    """On a terminal the bar is redrawn at every look, with what runs and for how long: it did
    not move while a job ran (its counts unchanged), for the whole of a trial."""
    import time
    from types import SimpleNamespace

    import e2mc.progress
    from e2mc.jobs.runner import _Progress

    monkeypatch.setattr(e2mc.progress, "is_terminal", lambda stream=None: True)
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    lines: list[str] = []
    progress = _Progress(3, 1, lines.append)
    job = SimpleNamespace(work=SimpleNamespace(key="trials/a/run"), started=1000.0)
    drawn = []
    for _ in range(3):
        progress.show(1, [job], 1)
        drawn.append(capsys.readouterr().err.rsplit("\r", 1)[-1])
        now[0] += 30
    progress.close()
    assert lines == []  # the bar, no lines
    assert ["trials/a/run 0 min" in drawn[0], "trials/a/run 0 min" in drawn[1],
            "trials/a/run 1 min" in drawn[2]] == [True, True, True], drawn
    assert all("1/3" in d and "1 queued, 1 running" in d for d in drawn), drawn
