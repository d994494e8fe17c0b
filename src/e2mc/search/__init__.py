"""``e2mc search``: does E2MC help *this* model, at which setting, and does it hold up?

:mod:`~e2mc.search.spec` (trials, the declared rule, what a search directory must match),
:mod:`~e2mc.search.runner` (training every trial and its control, inline or as jobs, and the
confirmation on the test split) and :mod:`~e2mc.search.report` (the markdown, the figure and
the confirmation's paired tests)."""

from e2mc.search.report import confirm_markdown, confirmation, plot_trajectories, search_markdown
from e2mc.search.runner import Search, SearchPreempted
from e2mc.search.spec import (
    RULE,
    SearchSpec,
    Trial,
    file_trials,
    grid_trials,
    make_spec,
    select,
)

__all__ = ["RULE", "Search", "SearchPreempted", "SearchSpec", "Trial", "confirm_markdown",
           "confirmation", "file_trials", "grid_trials", "make_spec", "plot_trajectories",
           "search_markdown", "select"]
