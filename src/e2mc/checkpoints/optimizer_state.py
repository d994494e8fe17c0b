"""An official optimizer state (VICReg LARS, SwAV LARC/SGD, SimSiam SGD) applied to the
optimizer of a method loaded from the official checkpoint."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from e2mc.checkpoints.api import unwrap


def restore_optimizer_state(optimizer: torch.optim.Optimizer, method: nn.Module,
                            state: dict[str, Any]) -> int:
    """Apply an official optimizer state (VICReg LARS, SwAV LARC/SGD, SimSiam SGD) to
    ``optimizer``, which :meth:`SSLMethod.build_optimizer` made: the per-parameter buffers
    (momentum) are restored, the optimizer's own hyperparameters (lr, wd) are kept.

    The official runs listed their parameters in the model's ``parameters()`` order (SimSiam:
    encoder group then predictor group), which the method classes reproduce, so the ``k``-th saved
    parameter is ``list(method.parameters())[k]``. Momentum buffers are renamed between LARS's
    ``mu`` and SGD's ``momentum_buffer`` as needed. Returns the number of parameters restored.
    """
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
