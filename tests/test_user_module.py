"""A run built around your own module read back into it (e2mc.checkpoints.user_module): the
same weights, strictly; a module of another class or shape is one error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from e2mc.checkpoints.strict import CheckpointMismatchError
from e2mc.checkpoints.user_module import load_into_module, method_around
from e2mc.errors import InputError
from helpers import TINY_RUN, tiny_base


class Encoder(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_the_runs_weights_in_a_copy_of_the_module_or_one_error(tmp_path: Path) -> None:
    from e2mc.training import continue_module

    _, data = tiny_base(tmp_path)
    overrides = [o for o in TINY_RUN if not o.startswith(("model.backbone", "method.params"))]
    mine = Encoder()
    continue_module(mine, "fmnist-vicreg-e2mc", tmp_path / "run",
                    [*overrides, f"data.dataset={data}", "method.params={projector: 32-32}",
                     "training.max_steps=2"])
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["model"]
    backbone, dim, info = load_into_module(tmp_path / "run" / "checkpoint.pt", mine)
    assert dim == 8 and backbone is not mine and info["step"] == 2
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, saved[f"backbone.{key}"]), key
    method, _ = method_around(tmp_path / "run" / "checkpoint.pt", Encoder())
    assert torch.equal(method.projector[0].weight, saved["projector.0.weight"])
    with pytest.raises(InputError, match="trained around a Encoder, not a Sequential"):
        load_into_module(tmp_path / "run" / "checkpoint.pt", nn.Sequential(nn.Flatten()))
    with pytest.raises(CheckpointMismatchError):
        load_into_module(tmp_path / "run" / "checkpoint.pt", Encoder(width=16))
    with pytest.raises(InputError, match="is neither an e2mc checkpoint of a run .* nor a "
                                         "state dict of the module"):
        torch.save({"weights": "text"}, tmp_path / "other.pt")
        load_into_module(tmp_path / "other.pt", mine)
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")  # another module's weights
    with pytest.raises(CheckpointMismatchError, match="2 missing keys: net.0.weight"):
        load_into_module(tmp_path / "other.pt", mine)
