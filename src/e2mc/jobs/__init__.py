"""Jobs: every training run and every evaluation of ``e2mc search`` as one unit of work, run in
the search's own process (``--executor inline``, the default), in processes of their own on this
machine (``local``) or as SLURM jobs (``slurm``); the last two through submitit, imported only
when asked for (``pip install 'e2mc[cluster]'``).

A job is a picklable callable: :class:`TrainJob` trains one configuration in one run directory
with :func:`~e2mc.training.run.run_training` (``done_marker``), as the inline search does (the
run is marked done exactly when it reached its configured end), and :class:`CallJob` runs one
evaluation. Under SLURM a training job has one task per GPU on each of its nodes, and each task
joins the process group from submitit's environment (``TorchDistributedEnvironment().export()``
sets ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ...), then takes the same code path as under
``torchrun``.

The search stays the one that decides. :class:`JobRunner` submits what is not done, records
every job id in ``SEARCH/jobs.json`` (written atomically), waits with a progress display
(queued / running / done / failed, each job's log path), and the search then reads the results
back through the run directories and applies its rule. A job that fails stops the search with
its log tail (:class:`~e2mc.errors.RunFailure`, exit 1); nothing is selected on partial data.

**Resuming.** A run or evaluation that is done is never resubmitted. A recorded SLURM job that
is still pending or running is waited for (``submitit.SlurmJob(folder, job_id)`` re-created from
the jobs folder). A local job cannot be re-attached from another process (submitit's
``LocalJob`` follows its process through the ``Popen`` object of the process that started it),
so a recorded local job is waited for while its controller process is alive (the same process:
``jobs.json`` records its pid with its start time, boot id and host) or a live process holds its
run directory's lock (``.e2mc.lock``, asked of the kernel: a lock left by a crash, or naming a
process of another host that ended, is not waited for); only after that, and only if its run is not
done, is it submitted again, and the run resumes from its checkpoint.

**Job states.** A SLURM job's state comes from ``sacct`` where accounting exists, and from
``squeue`` / ``scontrol show job`` (:mod:`e2mc.jobs.slurm_state`); only an end SLURM reports ends
a job: while SLURM does not answer (its controller down) the states are unknown and waited out
(``--slurm-outage``, 30 min), and a job requeued after its work was done is cancelled, then
waited for. A job that ended without a result (cancelled, failed, timed out, or unknown to a
SLURM that answers) stops the search with one line naming it and its log (exit 1), and the same
command submits it anew. ``jobs.json`` records each job's state and its owner (the search
waiting for it, also after a takeover).

**Pre-emption and time limits** (:data:`e2mc.training.preemption.SIGNAL_TABLE`). SLURM sends
submitit's signal (``--signal=USR2@300``, ``--signal-delay``) before the time limit, and
``SIGTERM`` on ``scancel`` or on a pre-emption that it requeues itself. A training job turns
submitit's signal into the trainer's path (submitit's own handler, which would requeue at once and
race the checkpoint, is replaced for the job's life): finish the step, write ``checkpoint.pt``,
``scontrol requeue`` once (``training.requeue``); on ``SIGTERM`` or ``SIGHUP`` the trainer
checkpoints without a requeue of its own. Either way the job then exits (75) without a result, so
the search sees it queued again (requeued) or ended (cancelled). ``checkpoint()`` makes every job a
submitit checkpointable callable (``submitit.helpers.Checkpointable``'s protocol) for a signal
outside the trainer's window (an evaluation, or ``training.preempt_signals`` empty): submitit
requeues the job, which starts again (a run from its last checkpoint). A local job that is pre-
empted or killed ends without finishing; the search stops (exit 75) and running it again resumes
the run."""

from e2mc.jobs.options import (
    DEFAULT_SLURM_TIME_MIN,
    EXECUTORS,
    SIGNAL_DELAY_S,
    ExecutorOptions,
    import_submitit,
    make_executor,
    parse_slurm_settings,
    slurm_parameters,
)
from e2mc.jobs.runner import JobRunner, JobStopped
from e2mc.jobs.work import CallJob, TrainJob, Work, evaluation_work

__all__ = [
    "DEFAULT_SLURM_TIME_MIN",
    "EXECUTORS",
    "SIGNAL_DELAY_S",
    "CallJob",
    "ExecutorOptions",
    "JobRunner",
    "JobStopped",
    "TrainJob",
    "Work",
    "evaluation_work",
    "import_submitit",
    "make_executor",
    "parse_slurm_settings",
    "slurm_parameters",
]
