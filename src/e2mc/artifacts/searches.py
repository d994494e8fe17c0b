"""Search directories (:class:`SearchDir`)."""

from __future__ import annotations

import os
from pathlib import Path

from e2mc.artifacts.evaluations import EvalDir
from e2mc.artifacts.layout import SEARCH_JSON
from e2mc.artifacts.runs import RunDir


class SearchDir:
    """The files of one ``e2mc search`` directory (docs/search.md)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.json = self.root / SEARCH_JSON
        self.markdown = self.root / "search.md"
        self.plot = self.root / "search.png"
        self.confirm_json = self.root / "confirm.json"
        self.confirm_markdown = self.root / "confirm.md"
        self.feature_cache = self.root / "feature-cache"
        self.jobs_json = self.root / "jobs.json"
        self.jobs_dir = self.root / "jobs"

    def trial_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / slug / "run")

    def control_run(self, slug: str) -> RunDir:
        return RunDir(self.root / "trials" / f"control-{slug}")

    def confirm_run(self, seed: int, kind: str) -> RunDir:
        """``kind``: ``run`` (the selected trial) or ``control``."""
        return RunDir(self.root / "confirm" / f"seed{seed}" / kind)

    def confirm_eval(self, seed: int, kind: str) -> EvalDir:
        return EvalDir(self.root / "confirm" / f"seed{seed}" / f"{kind}-eval")

    def refuse_links(self, *inside: Path) -> None:
        """Refuse (:func:`e2mc.files.refuse_link`) a symbolic link at any folder or file the
        search makes: its folders, and every path from the root down to each of ``inside``."""
        from e2mc.files import refuse_link

        for path in (self.root / "trials", self.root / "confirm", self.feature_cache,
                     self.jobs_dir, self.jobs_json, self.json, self.markdown, self.plot,
                     self.confirm_json, self.confirm_markdown):
            refuse_link(path)
        for path in inside:
            for part in [path, *path.parents]:
                if part == self.root or self.root not in part.parents:
                    break
                refuse_link(part)


