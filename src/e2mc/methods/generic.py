"""``Generic``: any encoder and projector a user brings, trained with VICReg's or SimSiam's loss;
built by name it is saved and rebuilt like the other methods, built around modules, in code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from e2mc.methods.base import VIEW_RECIPES, MethodOutput, SSLMethod
from e2mc.methods.common import check_views, resolve_backbone
from e2mc.methods.heads import parse_mlp_spec, simsiam_predictor, vicreg_projector
from e2mc.methods.simsiam import sgd_with_predictor_group, simsiam_loss
from e2mc.methods.vicreg import lars_param_groups, vicreg_loss
from e2mc.optim import LARS
from e2mc.ranges import OneOf, Widths, above, at_least, between

LOSSES = ("vicreg", "simsiam")


class Generic(SSLMethod):
    """A ``backbone`` (a name for :func:`e2mc.models.build_backbone`, or a module mapping images
    to ``[n, feature_dim]``) and a ``projector`` (a module, or a size spec for VICReg's layout).

    ``loss="vicreg"``: VICReg's loss and LARS preset, E2MC on the hypercube. ``loss="simsiam"``:
    needs a ``predictor`` (a module, or its hidden width for SimSiam's layout); SimSiam's loss and
    SGD preset, E2MC on the hypersphere. The add-on gets the projector outputs. With module
    backbone and projector, ``feature_dim`` defaults to the projector's first Linear's input.
    """

    name = "generic"
    param_ranges = {"projector": Widths(),  # or a module
                    "loss": OneOf(LOSSES), "feature_dim": at_least(1),
                    "predictor": at_least(1),  # its hidden width, or a module
                    "sim_coeff": at_least(0), "std_coeff": at_least(0), "cov_coeff": at_least(0),
                    "predictor_lr": above(0), "view_recipe": OneOf(VIEW_RECIPES)}
    optimizer_ranges = {"eta": above(0), "momentum": between(0, 1, high_open=True),
                        "predictor_lr": above(0)}

    def __init__(self, backbone: str | nn.Module = "resnet50",
                 projector: str | nn.Module = "2048-2048", loss: str = "vicreg",
                 feature_dim: int | None = None, predictor: int | nn.Module | None = None,
                 sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0,
                 predictor_lr: float | None = None, view_recipe: str | None = None,
                 small_images: bool = False, in_channels: int = 3) -> None:
        super().__init__()
        if not isinstance(projector, nn.Module | str):
            raise ValueError("projector must be an nn.Module or a size spec like '2048-2048'")
        if loss == "simsiam" and predictor is None:
            raise ValueError("loss='simsiam' needs a predictor (a module or its hidden width)")
        if loss == "vicreg" and predictor is not None:
            raise ValueError("a predictor is only used with loss='simsiam'")
        if feature_dim is None and isinstance(backbone, nn.Module) \
                and isinstance(projector, nn.Module):
            feature_dim = next((m.in_features for m in projector.modules()
                                if isinstance(m, nn.Linear)), None)
        self.backbone, self.feature_dim, bb_hparams = resolve_backbone(
            backbone, small_images, in_channels, feature_dim)
        spec_hparams: dict[str, Any] = {}
        if isinstance(projector, str):
            spec_hparams["projector"] = projector
            out_dim = parse_mlp_spec(projector)[-1]
            projector = vicreg_projector(self.feature_dim, projector)
        else:
            out_dim = None
            spec_hparams["projector_class"] = type(projector).__name__
        if isinstance(predictor, int) and not isinstance(predictor, bool):
            if out_dim is None:
                raise ValueError("an int predictor (its hidden width) needs a projector spec; "
                                 "pass a predictor module with a projector module")
            spec_hparams["predictor"] = predictor
            predictor = simsiam_predictor(out_dim, predictor)
        elif predictor is not None and not isinstance(predictor, nn.Module):
            raise ValueError(f"predictor must be a module or an int, got {predictor!r}")
        self.projector = projector
        self.predictor = predictor
        self.loss_name = loss
        self.compact_space = "hypercube" if loss == "vicreg" else "hypersphere"
        self.view_recipe = view_recipe or loss
        self.coeffs = (sim_coeff, std_coeff, cov_coeff)
        self.predictor_lr = predictor_lr
        self.hparams: dict[str, Any] = {
            **bb_hparams, **spec_hparams, "loss": loss,
            "sim_coeff": sim_coeff, "std_coeff": std_coeff, "cov_coeff": cov_coeff,
            "predictor_lr": predictor_lr, "view_recipe": self.view_recipe}

    def forward(self, views: Sequence[torch.Tensor]) -> MethodOutput:
        check_views(views, 2, "Generic")
        z1, z2 = (self.projector(self.backbone(v)) for v in views[:2])
        if self.loss_name == "vicreg":
            loss, terms = vicreg_loss(z1, z2, *self.coeffs)
        else:
            assert self.predictor is not None
            loss = simsiam_loss(self.predictor(z1), self.predictor(z2), z1, z2)
            terms = {"negative_cosine": loss.detach()}
        return MethodOutput(loss=loss, terms=terms, embeddings=[z1, z2])

    def build_optimizer(self, lr: float, weight_decay: float, eta: float | None = None,
                        momentum: float = 0.9, predictor_lr: float | None = None
                        ) -> torch.optim.Optimizer:
        """VICReg's LARS preset (``eta``, default 0.001) or SimSiam's SGD preset
        (``predictor_lr``), following ``loss``; ``momentum`` 0.9."""
        if self.loss_name == "vicreg":
            if predictor_lr is not None:
                raise ValueError("unknown optimizer options: ['predictor_lr'] (an option of "
                                 "loss='simsiam')")
            return LARS(lars_param_groups(self, weight_decay), lr=lr, momentum=momentum,
                        eta=0.001 if eta is None else eta)
        if eta is not None:
            raise ValueError("unknown optimizer options: ['eta'] (an option of loss='vicreg')")
        predictor_lr = predictor_lr or self.predictor_lr or lr
        assert self.predictor is not None
        return sgd_with_predictor_group(self, lr, weight_decay, predictor_lr, momentum)
