"""Backbones by name (``resnet50``, ``torchvision:NAME[:WEIGHTS]``, ``timm:NAME[.TAG][(ARGS)]``,
``hf:REPO``, the package's ``cnn5`` / ``cnn5_small`` / ``vit_tiny_p4_28``; docs/checkpoints.md) as
pooled-feature extractors ``[B, C, H, W] -> [B, feature_dim]``."""

from e2mc.models.build import build_backbone, classifier_keys, input_channels
from e2mc.models.input_size import check_backbone_input, check_input_size, fixed_image_size
from e2mc.models.names import parse_backbone_name, timm_parts
from e2mc.models.pretrained import pretrained_weights, weights_from_checkpoint

__all__ = ["build_backbone", "check_backbone_input", "check_input_size", "classifier_keys",
           "fixed_image_size", "input_channels", "parse_backbone_name", "pretrained_weights",
           "timm_parts", "weights_from_checkpoint"]
