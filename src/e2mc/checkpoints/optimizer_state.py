"""An official optimizer state applied to the optimizer of a method loaded from its file."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from e2mc.checkpoints.api import unwrap


def restore_optimizer_state(optimizer: torch.optim.Optimizer, method: nn.Module,
                            state: dict[str, Any]) -> int:
    """Restore the per-parameter buffers (momentum; LARS's ``mu`` and SGD's
    ``momentum_buffer`` renamed as needed) of an official optimizer state into ``optimizer``,
    keeping its lr and wd; returns how many parameters were restored. The ``k``-th saved
    parameter is ``list(method.parameters())[k]``: the method classes keep the official order."""
    method = unwrap(method)
    try:
        saved_ids = [i for g in state["param_groups"] for i in g["params"]]
        per_param = state["state"]
    except (KeyError, TypeError) as err:
        raise ValueError("not an optimizer state dict (needs 'state' and 'param_groups')") from err
    params = list(method.parameters())
    if len(saved_ids) != len(params):
        raise ValueError(f"the optimizer state covers {len(saved_ids)} parameters, the model has "
                         f"{len(params)}")
    key = getattr(optimizer, "momentum_key", "momentum_buffer")
    in_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    restored = 0
    for pos, sid in enumerate(saved_ids):
        saved = per_param.get(sid)
        p = params[pos]
        if not saved or id(p) not in in_optimizer:
            continue
        converted: dict[str, Any] = {}
        for k, v in saved.items():
            k = key if k in ("mu", "momentum_buffer") else k
            if isinstance(v, torch.Tensor) and v.ndim > 0:
                if v.shape != p.shape:
                    raise ValueError(f"optimizer state {k!r} of parameter {pos} has shape "
                                     f"{tuple(v.shape)}, the parameter {tuple(p.shape)}")
                v = v.to(device=p.device, dtype=p.dtype).contiguous()
            converted[k] = v
        optimizer.state[p] = converted
        restored += 1
    return restored
