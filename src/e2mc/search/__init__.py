"""``e2mc search``: :mod:`~e2mc.search.spec` (trials, the rule), :mod:`~e2mc.search.runner`
(training trials and controls, the confirmation) and :mod:`~e2mc.search.report` (tables, figure,
paired tests). The search directory: docs/search.md."""

from e2mc.search.report import confirm_markdown, confirmation
from e2mc.search.runner import Search, SearchPreempted
from e2mc.search.spec import SearchSpec, Trial, file_trials, grid_trials, make_spec, select

__all__ = ["Search", "SearchPreempted", "SearchSpec", "Trial", "confirm_markdown", "confirmation",
           "file_trials", "grid_trials", "make_spec", "select"]
