"""``e2mc search``: :mod:`~e2mc.search.spec` (trials, the rule), :mod:`~e2mc.search.runner`
(training trials and controls, the confirmation) and :mod:`~e2mc.search.report` (tables, figure,
paired tests). The search directory: docs/search.md."""

from e2mc.search.report import confirm_markdown, confirmation, plot_trajectories, search_markdown
from e2mc.search.runner import Search, SearchPreempted
from e2mc.search.spec import RULE, SearchSpec, Trial, file_trials, grid_trials, make_spec, select

__all__ = ["RULE", "Search", "SearchPreempted", "SearchSpec", "Trial", "confirm_markdown",
           "confirmation", "file_trials", "grid_trials", "make_spec", "plot_trajectories",
           "search_markdown", "select"]
