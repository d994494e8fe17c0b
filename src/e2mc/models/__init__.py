"""Backbones by name: torchvision, timm and Hugging Face models as pooled-feature extractors.

Names (``model.backbone`` in a config, ``--backbone`` on the command line):

* ``resnet50`` or ``torchvision:resnet50``: a torchvision classification model, randomly
  initialised; ``torchvision:resnet50:IMAGENET1K_V2`` loads that torchvision weights enum
  (downloaded once into torch.hub's cache, hash-checked);
* ``timm:resnet50``: a timm model (the ``[timm]`` extra), randomly initialised;
  ``timm:resnet50.a1_in1k`` (a pretrained tag after the dot) loads that tag's pretrained weights
  (``timm.create_model(..., pretrained=True)``: the Hugging Face hub's cache, or torch.hub's
  for the tags timm downloads by URL); ``timm:vit_small_patch16_224(num_heads=12)`` passes
  keyword arguments (Python literals) to ``timm.create_model`` (moco-v3's ViT-S, 12 heads);
* ``hf:<repo id or local folder>``: a Hugging Face vision model (the ``[hf]`` extra) with its
  weights (``from_pretrained``, the Hugging Face hub's cache);
* ``cnn5`` / ``cnn5_small``: the package's small CNNs for 28-32 px images on a CPU;
  ``vit_tiny_p4_28``: its small vision transformer for 28 px images (patch 4, 4 layers, 96 wide).

Every backbone maps ``[B, C, H, W]`` images to ``[B, feature_dim]`` pooled features. Weights
for any of them can also come from a checkpoint (``--from FILE_OR_URL``). When a checkpoint
overwrites every weight anyway, :func:`weights_from_checkpoint` skips fetching pretrained ones.
:func:`pretrained_weights` says which pretrained weights a name loads; weights that are neither
in the cache nor downloadable (offline) are a ``ValueError`` naming the cache directory and the
file or tag it looked for.

The modules: :mod:`~e2mc.models.names` (what a name says), :mod:`~e2mc.models.pretrained` (the
weights a name loads), :mod:`~e2mc.models.build` (:func:`build_backbone`),
:mod:`~e2mc.models.input_size` (the image sizes a backbone takes), :mod:`~e2mc.models.small`
and :mod:`~e2mc.models.surgery`.
"""

from e2mc.models.build import (
    OTHERS,
    RESNETS,
    SUPPORTED_BACKBONES,
    HFBackbone,
    build_backbone,
    classifier_keys,
    torchvision_names,
)
from e2mc.models.input_size import (
    check_backbone_input,
    check_input_size,
    fixed_image_size,
    input_size_problem,
)
from e2mc.models.names import SOURCES, describe, parse_backbone_name, timm_parts
from e2mc.models.pretrained import pretrained_weights, weights_from_checkpoint
from e2mc.models.small import SMALL_CNNS, SMALL_VITS, SmallConvNet, small_vit
from e2mc.models.surgery import input_channels, replace_first_conv, strip_classifier

__all__ = ["OTHERS", "RESNETS", "SMALL_CNNS", "SMALL_VITS", "SOURCES", "SUPPORTED_BACKBONES",
           "HFBackbone", "SmallConvNet", "build_backbone", "check_backbone_input",
           "check_input_size", "classifier_keys", "describe", "fixed_image_size",
           "input_channels", "input_size_problem", "parse_backbone_name", "pretrained_weights",
           "replace_first_conv", "small_vit", "strip_classifier", "timm_parts",
           "torchvision_names", "weights_from_checkpoint"]
