"""Suite-wide settings: one intra-op thread (tiny tensors; spawned ranks and loader workers
would otherwise oversubscribe a 2-core CI machine), headless matplotlib."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

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
