"""Jobs: each training run and evaluation of ``e2mc search`` as one picklable unit of work, run
inline (default), in local processes or as SLURM jobs (submitit, imported only when asked for).
:class:`JobRunner` submits what is not done, records it in ``jobs.json`` and waits; the search
alone decides. Resuming, SLURM states, pre-emption: docs/search.md."""

from e2mc.jobs.options import ExecutorOptions, make_executor, parse_slurm_settings, slurm_parameters
from e2mc.jobs.runner import JobRunner, JobStopped
from e2mc.jobs.work import TrainJob, Work, evaluation_work

__all__ = [
    "ExecutorOptions", "JobRunner", "JobStopped", "TrainJob", "Work", "evaluation_work",
    "make_executor", "parse_slurm_settings", "slurm_parameters",
]
