"""Several training tasks on the CPU without a cluster: ``--tasks-per-node`` in the sbatch
script submitit would submit (one task per GPU otherwise; evaluations one task), its refusals,
and the torchrun variables a task of an ``srun`` step derives from SLURM's
(:func:`e2mc.distributed.srun_environment`; the real run is in tests/test_slurm.py)."""

from __future__ import annotations

import pytest

from e2mc.distributed import srun_environment
from e2mc.errors import InputError
from helpers import fake_slurm_commands

STEP = {"SLURM_JOB_ID": "41", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "cpu[007-008,12],gpu1",
        "SLURM_JOB_NODELIST": "cpu[005-008,12],gpu1"}


def test_a_task_of_an_srun_step_gets_torchruns_variables() -> None:
    assert srun_environment(STEP) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                      "MASTER_ADDR": "cpu007", "MASTER_PORT": "20041"}
    assert srun_environment({**STEP, "MASTER_PORT": "29500"})["MASTER_PORT"] == "29500"
    assert srun_environment({**STEP, "SLURM_STEP_NODELIST": "vm"})["MASTER_ADDR"] == "vm"
    # under torchrun or submitit (WORLD_SIZE set), in a batch script (no step), one task: none
    assert srun_environment({**STEP, "WORLD_SIZE": "4"}) == {}
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}
    assert srun_environment({**batch, "SLURM_NTASKS": "4"}) == {}
    assert srun_environment({**STEP, "SLURM_STEP_NUM_TASKS": "1"}) == {}


def test_tasks_per_node_in_the_job_script(tmp_path, monkeypatch) -> None:
    submitit = pytest.importorskip("submitit")
    from e2mc.jobs import ExecutorOptions, make_executor

    options = ExecutorOptions(kind="slurm", tasks_per_node=2, cpus_per_task=1)
    options.check()
    fake_slurm_commands(monkeypatch, tmp_path)  # the script is made, never submitted

    def script(kind: str) -> list[str]:
        executor = make_executor(options, tmp_path, "e2mc-search", kind=kind)
        assert isinstance(executor, submitit.SlurmExecutor)
        return executor._make_submission_file_text("python", "x").splitlines()

    assert "#SBATCH --ntasks-per-node=2" in script("train")
    assert "#SBATCH --ntasks-per-node=1" in script("eval")
    assert not any("gpus" in line for line in script("train"))
    with pytest.raises(InputError, match="--tasks-per-node is for jobs on the CPU"):
        ExecutorOptions(kind="slurm", tasks_per_node=2, gpus_per_node=4).check()
    with pytest.raises(InputError, match="--tasks-per-node only apply to --executor local or"):
        ExecutorOptions(tasks_per_node=2).check()
    with pytest.raises(InputError, match="--tasks-per-node must be at least 1, got 0"):
        ExecutorOptions(kind="slurm", tasks_per_node=0).check()


def test_the_slurm_executor_without_slurm_is_one_error_line(tmp_path, monkeypatch) -> None:
    pytest.importorskip("submitit")
    from e2mc.jobs import ExecutorOptions, make_executor

    monkeypatch.setenv("PATH", str(tmp_path))  # neither sbatch nor srun
    with pytest.raises(InputError, match="sbatch and srun not found on PATH"):
        make_executor(ExecutorOptions(kind="slurm"), tmp_path, "e2mc-search")
