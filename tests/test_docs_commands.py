"""Docs that run (issue 33): every ``e2mc`` command in the shell blocks of README.md and docs/
is one of three kinds.

- **run**: the default. The command runs here, in the order of its page, in a folder of the
  page's own (so that the pages run in any order, on any worker), at a small size: ``--data``
  (any value, or none for a training command) becomes a 2,000-image slice of the shipped
  Fashion-MNIST, training commands get ``--set`` overrides for one step of batch 16,
  evaluations one probe epoch and no feature cache, and the run directories a page starts from
  (``runs/vicreg-e2mc``, ``runs/vicreg-continued``, ``my-run.yaml``, ``resnet18_timm.pt``) are
  made first. ``--data PATH/TO/folder`` (your own image folder) becomes a tiny folder of 32 px
  RGB images, and ``r18.pt`` a torchvision resnet18's state dict. It must exit 0.
- **parsed**: a block marked ``<!-- docs test: parsed, not run (REASON) -->`` on the line
  above its fence (ImageNet, torchrun, SLURM, downloads, files of the reader's own). Its
  commands parse with the real argparse parsers: their options exist, take the values given,
  and the required ones are there.
- **illustrative**: a block with a line ``# illustrative`` (a synopsis with ``[--optional]``
  brackets, ``...``): not checked.

The README's Python blocks run in tests/test_readme.py; every python block here compiles.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest

from e2mc.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
ILLUSTRATIVE = "# illustrative"
PARSED = re.compile(r"^<!-- docs test: parsed, not run \((.+)\) -->$")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def commands(page: Path) -> list[tuple[int, str, str]]:
    """``(line, command without 'e2mc', kind)`` of each e2mc command in the page's
    bash/sh/shell blocks (kind: ``run``, ``parsed`` or ``illustrative``); continuation lines
    joined, comments dropped."""
    found, block, start, marked, previous = [], None, 0, "run", ""
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if block is None:
            if stripped.startswith("```") and stripped[3:].strip() in ("bash", "sh", "shell"):
                block, marked = [], "parsed" if PARSED.match(previous) else "run"
            previous = stripped
            continue
        if stripped.startswith("```"):
            joined = "\n".join(block).replace("\\\n", " ")
            for offset, text in enumerate(joined.splitlines()):
                for part in re.split(r"&&|;|\|", text):
                    m = re.search(r"(?:^|\s)(?:e2mc|-m e2mc)\s+(.*)$", part.strip())
                    if m and not part.strip().startswith(("pip", "python -m pip")):
                        found.append((start + offset, m.group(1).strip(), marked))
            block = None
            continue
        if stripped.startswith(ILLUSTRATIVE):
            marked = "illustrative"
        if not block:
            start = number
        block.append(line.split(" #")[0] if not stripped.startswith("#") else "")
    return found


ALL = [(page, line, cmd, kind) for page in pages() for line, cmd, kind in commands(page)]
CHECKED = [c for c in ALL if c[3] != "illustrative"]
RUN = [c for c in ALL if c[3] == "run"]


def _id(c: tuple[Path, int, str, str]) -> str:
    return f"{c[0].relative_to(REPO)}:{c[1]}"


def test_the_docs_have_commands_and_most_are_checked() -> None:
    kinds = {k: sum(c[3] == k for c in ALL) for k in ("run", "parsed", "illustrative")}
    print(f"{len(ALL)} commands: {kinds['run']} run, {kinds['parsed']} parsed only, "
          f"{kinds['illustrative']} illustrative")
    assert len(CHECKED) >= 40 and len(CHECKED) > 3 * kinds["illustrative"]
    assert kinds["run"] >= 17


def test_a_parsed_only_block_says_why() -> None:
    """Every marker names its reason and stands right above a shell block."""
    for page in pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("<!-- docs test"):
                assert PARSED.match(line.strip()), f"{page.relative_to(REPO)}:{i + 1}: {line}"
                assert lines[i + 1].strip() in ("```bash", "```sh", "```shell"), \
                    f"{page.relative_to(REPO)}:{i + 1}: no shell block right below the marker"


@pytest.mark.parametrize("page,line,command,kind", CHECKED, ids=[_id(c) for c in CHECKED])
def test_every_documented_command_parses(page: Path, line: int, command: str,
                                         kind: str, capsys) -> None:
    parser = build_parser()
    argv = shlex.split(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        err = capsys.readouterr().err.strip().splitlines()
        if stop.code == 0:  # --help, --version
            return
        pytest.fail(f"{page.relative_to(REPO)}:{line}: e2mc {command}\n  {err[-1] if err else ''}")
    assert args.command == argv[0]


TINY_DATA = "tiny.npz"
#: ``PATH/TO/folder``: an image folder of your own (train/ and test/, 3 classes, 32 px RGB).
TINY_FOLDER = "tiny-folder"
#: One step of batch 16 on the CPU, one thread, no progress bar (after the command's own --set).
ONE_STEP = ["training.max_steps=1", "training.batch_size=16", "training.progress=false",
            "data.num_workers=0", "training.cpu_threads=1", "training.device=cpu"]
TRAINS = ("pretrain", "continue", "search")


def small(argv: list[str]) -> list[str]:
    """The documented command at a small size: the tiny data, one training step, one probe
    epoch, no feature cache."""
    argv = list(argv)
    if "--data" in argv:
        given = argv[argv.index("--data") + 1]
        argv[argv.index("--data") + 1] = TINY_FOLDER if given.endswith("/folder") else TINY_DATA
    elif argv[0] in TRAINS:
        argv += ["--data", TINY_DATA]
    if argv[0] in TRAINS:
        argv += [a for s in ONE_STEP for a in ("--set", s)]
    if argv[0] == "search":
        argv += ["--probe-epochs", "1", "--quiet"]
    if argv[0] == "eval":
        argv += ["--epochs", "1", "--no-cache", "--quiet", "--device", "cpu"]
    if argv[0] == "analyze":
        argv += ["--num-samples", "64", "--knn-k", "5", "--quiet", "--device", "cpu"]
    return argv


@pytest.fixture(scope="module")
def docs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the documented commands run in: the tiny data, the run directories the
    pages evaluate (one step from the shipped base each) and a configuration file."""
    import contextlib
    import importlib.util
    import io
    import os

    import numpy as np
    import torch

    from e2mc.cli import main
    from e2mc.data.datasets import builtin_fashion_mnist_path

    folder = tmp_path_factory.mktemp("docs")
    with np.load(builtin_fashion_mnist_path()) as f:
        np.savez(folder / TINY_DATA, x_train=f["x_train"][:2000], y_train=f["y_train"][:2000],
                 x_test=f["x_test"][:200], y_test=f["y_test"][:200])
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for preset, out in (("fmnist-vicreg-e2mc", "runs/vicreg-e2mc"),
                            ("fmnist-vicreg-continued", "runs/vicreg-continued")):
            assert main(small(["continue", "--config", preset, "--from", "builtin:demo-vicreg",
                               "--out", out])) == 0
        _own_folder(folder / TINY_FOLDER)  # checkpoints.md: your backbone, your image folder
        shared = tmp_path_factory.mktemp("weights") / "r18.pt"  # (linked: 45 MB, read only)
        torch.save(_resnet18_backbone().state_dict(), shared)
        (folder / "r18.pt").symlink_to(shared)
        if importlib.util.find_spec("timm") is not None:  # checkpoints.md: your timm weights
            import timm

            torch.save(timm.create_model("resnet18").state_dict(), "resnet18_timm.pt")
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            assert main(["config", "show", "fmnist-vicreg-continued"]) == 0
        (folder / "my-run.yaml").write_text(shown.getvalue())
    finally:
        os.chdir(cwd)
    return folder


def _own_folder(root: Path) -> None:
    """A tiny image folder of one's own: 3 classes of 32 px RGB images, 70 per class in
    ``train/`` and 8 in ``test/``, each class brighter in one channel."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, per_class in (("train", 70), ("test", 8)):  # (kNN k=200 needs 200)
        for c in range(3):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(per_class):
                x = rng.integers(0, 128, (32, 32, 3), dtype=np.uint8)
                x[..., c] += 100
                Image.fromarray(x).save(root / split / f"c{c}" / f"{i}.png")


def _resnet18_backbone() -> Any:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    model.fc = torch.nn.Identity()
    return model


def _page_param(page: Path) -> object:
    """A page's run commands as one test; a page with a search (trials, controls,
    confirmation: about 20 s at this size) is marked slow."""
    cmds = [(line, cmd) for p, line, cmd, _ in RUN if p == page]
    slow = [pytest.mark.slow] if any(cmd.split()[0] == "search" for _, cmd in cmds) else []
    return pytest.param(page, cmds, id=str(page.relative_to(REPO)), marks=slow)


RUN_PAGES = list(dict.fromkeys(c[0] for c in RUN))


@pytest.mark.slow
@pytest.mark.parametrize("page,cmds", [_page_param(page) for page in RUN_PAGES])
def test_documented_commands_run_at_a_small_size(page: Path, cmds: list[tuple[int, str]],
                                                 docs_folder: Path, tmp_path: Path,
                                                 monkeypatch, capsys) -> None:
    """A page's commands, in the page's order, in a folder of the page's own (a copy of
    ``docs_folder``): a command may use what the commands above it on its page wrote, never
    what another page or another test wrote, so any order of the tests and any worker run
    them alike."""
    import shutil

    from e2mc.cli import main

    folder = tmp_path / "page"
    shutil.copytree(docs_folder, folder, symlinks=True)
    monkeypatch.chdir(folder)
    for line, command in cmds:
        argv = small(shlex.split(command))
        if "timm" in command:
            pytest.importorskip("timm", reason="the [timm] extra is not installed")
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{page.relative_to(REPO)}:{line}: e2mc {shlex.join(argv)}\n" \
                          f"{err[-2000:]}"
        if "--out" in argv:  # it wrote what it says
            written = folder / argv[argv.index("--out") + 1]
            assert written.is_dir() and any(written.iterdir()), written


def python_blocks() -> list[tuple[Path, int, str]]:
    found = []
    for page in pages():
        text = page.read_text()
        for m in re.finditer(r"```python\n(.*?)^\s*```", text, flags=re.S | re.M):
            found.append((page, text[:m.start()].count("\n") + 1,
                          textwrap.dedent(m.group(1))))  # a block inside a list item
    return found


def test_every_documented_python_block_is_python() -> None:
    """Each block compiles (the README's blocks also run: tests/test_readme.py)."""
    import ast

    blocks = python_blocks()
    assert len(blocks) >= 5
    for page, line, code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as err:
            pytest.fail(f"{page.relative_to(REPO)}:{line + (err.lineno or 0)}: {err.msg}")
