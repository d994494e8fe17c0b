"""Suite-wide settings: one intra-op thread (tiny tensors; spawned ranks and loader workers
would otherwise oversubscribe a 2-core CI machine), headless matplotlib."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
