"""Shared by several test modules: a free loopback port for the 2-process gloo tests, and the
overrides of a tiny training run (a small torchvision model on 16 px single-channel images)."""

from __future__ import annotations

import socket

#: A continued or pretraining run in seconds on a CPU (``--set`` / ``load_config`` overrides).
TINY_RUN = ["model.backbone=mobilenet_v3_small", "model.in_channels=1", "data.image_size=16",
            "data.channels=1", "training.batch_size=8", "training.epochs=1",
            "training.log_every=1", "training.progress=false", "data.num_workers=0",
            "training.device=cpu", "training.cpu_threads=1",
            "training.keep_epoch_checkpoints=false", "method.params={projector: 32-32}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
