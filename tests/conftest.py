"""Suite-wide settings: one intra-op thread (tiny tensors; spawned ranks and loader workers
would otherwise oversubscribe a 2-core CI machine), headless matplotlib, a file-hash table of
the test process's own; the order (random, or reversed) and the gpu tests' skip."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# the table of image-file hashes (e2mc.data.file_hashes) of the tests' own images: one per test
# process and the processes it starts, never the user's
# (removed when the process that made it ends)
if "E2MC_HASH_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _hashes = tempfile.mkdtemp(prefix="e2mc-test-hashes-")
    atexit.register(shutil.rmtree, _hashes, ignore_errors=True)
    os.environ["E2MC_HASH_CACHE"] = os.path.join(_hashes, "file-hashes.sqlite3")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for every test module, whatever an earlier one set (a run's
    ``training.cpu_threads`` changes it); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- -n auto
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores this process may use. Much of the suite waits
    (on spawned processes' imports, SLURM, polling): two workers on a 2-core machine used 140 %
    of its 200 %. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from e2mc.processes import available_cores

    return available_cores() + 1


# ----------------------------------------------------------------------------- the order
# pytest-randomly (a dev dependency) runs the tests in a random order, a new seed each run:
# no test may depend on another having run. The seed is printed last, so that a failure can be
# replayed (pytest -p randomly --randomly-seed=N); --reverse runs them in reverse order
# (with -p no:randomly, the order of the files reversed).
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--reverse", action="store_true",
                     help="run the tests in reverse order (with -p no:randomly)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse"):
        items.reverse()
    if not torch.cuda.is_available():  # the gpu tests: one line each, saying why
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none here): scripts/gpu-check.sh "
                                       "runs these on a GPU machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and getattr(config.option, "randomly_reorganize", True):
        terminalreporter.write_line(
            f"test order: pytest-randomly seed {seed} (replay: python -m pytest -q -n auto "
            f"-p randomly --randomly-seed={seed})")
    elif config.getoption("--reverse"):
        terminalreporter.write_line("test order: reversed")
