"""Run artifacts, defined once: every file a training run, an evaluation or a search writes, and
the one reader of each.

A **training run directory** (``e2mc continue`` / ``e2mc pretrain``)::

    config.yaml              the resolved configuration
    checkpoint.pt            latest training checkpoint (resumable)
    best.pt                  the best step by the monitored metric (``--keep-best``)
    checkpoints/epoch_XXXX.pt  model-only copy after each epoch (epoch 0 = the start)
    metrics.jsonl            one JSON object per logged step (training terms, monitor values)
    config_changes.jsonl     configuration changes accepted on resume, with their first step
    val_split.json           the held-out validation indices (``--val-split``)
    start.json               what the run started from (checkpoint, pretrained weights or a
                             module) and the SHA-256 of its starting backbone's state dict
    monitor.png              the monitor's validation metrics against steps (kept step marked)
    tensorboard/             the same scalars for TensorBoard
    done.json                the step and the end the run reached (written by ``e2mc search`` when
                             the run finished as configured; never after a pre-emption)
    .e2mc.lock               held by the process writing the directory (:func:`writer_lock`; also
                             in evaluation and search directories)

An **evaluation directory** (``e2mc eval``)::

    results.json             :class:`EvalResults`: one :class:`EvalEntry` per probe and seed
    predictions/<name>.<generation>.npz   per-image top-1 predictions and labels of each entry
                             (written first; results.json, written last, records their sha256)
    .generations.json        the generations of predictions/ files this directory's
                             evaluations wrote: its clean-up deletes only those (and the files
                             the replaced results.json named), never a file it did not write

A **search directory** (``e2mc search``, :class:`SearchDir`)::

    search.json, search.md, search.png   the spec and rule, the table, the trajectories
    trials/<trial>-<hash>/run, trials/control-<overrides>-<hash>   training run directories
                              (+ done.json once finished); <hash>: of the trial's overrides
    confirm/seed<N>/{run,control}[-eval]  the confirmation runs and their test evaluations
    confirm.json, confirm.md               the paired tests of the confirmation
    feature-cache/                         features of the confirmation's evaluations
    jobs.json, jobs/                       with ``--executor local|slurm``: each run's and
                                           evaluation's job id, and submitit's files and logs

The package, one room a concept: :mod:`~e2mc.artifacts.layout` (the file names, JSON lines,
the mean and SE of a column), :mod:`~e2mc.artifacts.locks` (one writer per directory),
:mod:`~e2mc.artifacts.runs`, :mod:`~e2mc.artifacts.evaluations` and
:mod:`~e2mc.artifacts.searches` (each kind of directory); the public names are re-exported
here.
"""

from e2mc.artifacts.evaluations import (
    EvalDir,
    EvalEntry,
    EvalResults,
    EvalSetDir,
    evaluation_set_names,
    slug_dir_name,
    summarize,
)
from e2mc.artifacts.layout import (
    BEST,
    CHECKPOINT,
    CONFIG,
    CONFIG_CHANGES,
    EPOCH_DIR,
    GENERATIONS,
    LOCK,
    METRICS,
    MONITOR_PLOT,
    PREDICTIONS_DIR,
    RESULTS,
    RUN_DONE,
    SEARCH_JSON,
    SEARCH_MD,
    START,
    TENSORBOARD_DIR,
    VAL_SPLIT,
    mean_se,
    read_jsonl,
    write_jsonl,
)
from e2mc.artifacts.locks import DirectoryBusy, describe_holder, live_writer, writer_lock
from e2mc.artifacts.runs import (
    BUILTIN_CHECKPOINTS,
    BUILTIN_PREFIX,
    RunDir,
    RunModel,
    builtin_checkpoint,
    run_model,
)
from e2mc.artifacts.searches import SearchDir

__all__ = [
    "BEST", "BUILTIN_CHECKPOINTS", "BUILTIN_PREFIX", "CHECKPOINT", "CONFIG", "CONFIG_CHANGES",
    "EPOCH_DIR", "GENERATIONS", "LOCK", "METRICS", "MONITOR_PLOT", "PREDICTIONS_DIR",
    "RESULTS", "RUN_DONE", "SEARCH_JSON", "SEARCH_MD", "START", "TENSORBOARD_DIR", "VAL_SPLIT",
    "DirectoryBusy", "EvalDir", "EvalEntry", "EvalResults", "EvalSetDir", "RunDir", "RunModel",
    "SearchDir", "builtin_checkpoint", "describe_holder", "evaluation_set_names", "live_writer",
    "mean_se", "read_jsonl", "run_model", "slug_dir_name", "summarize", "write_jsonl",
    "writer_lock",
]
