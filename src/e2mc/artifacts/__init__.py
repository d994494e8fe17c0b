"""Run artifacts, defined once: every file a training run, an evaluation or a search writes, and
the one reader of each (the directory layouts: docs/architecture.md, docs/cli.md).

:mod:`~e2mc.artifacts.layout` (file names, JSON lines, mean and SE), :mod:`~e2mc.artifacts.locks`
(one writer per directory), :mod:`~e2mc.artifacts.runs`, :mod:`~e2mc.artifacts.evaluations` and
:mod:`~e2mc.artifacts.searches` (each kind of directory); public names are re-exported here."""

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
    EPOCH_DIR,
    GENERATIONS,
    LOCK,
    RESULTS,
    SEARCH_JSON,
    mean_se,
    read_jsonl,
)
from e2mc.artifacts.locks import DirectoryBusy, describe_holder, live_writer, writer_lock
from e2mc.artifacts.runs import BUILTIN_CHECKPOINTS, RunDir, RunModel, builtin_checkpoint, run_model
from e2mc.artifacts.searches import SearchDir

__all__ = [
    "BEST", "BUILTIN_CHECKPOINTS", "CHECKPOINT", "EPOCH_DIR", "GENERATIONS", "LOCK", "RESULTS",
    "SEARCH_JSON", "DirectoryBusy", "EvalDir", "EvalEntry", "EvalResults", "EvalSetDir",
    "RunDir", "RunModel", "SearchDir", "builtin_checkpoint", "describe_holder",
    "evaluation_set_names", "live_writer", "mean_se", "read_jsonl", "run_model",
    "slug_dir_name", "summarize", "writer_lock",
]
