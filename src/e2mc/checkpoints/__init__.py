"""Checkpoints (docs/checkpoints.md): official and own formats, strict loading, export."""

from e2mc.checkpoints.api import (
    load_checkpoint,
    load_official,
    restore_optimizer_state,
    save_checkpoint,
)
from e2mc.checkpoints.backbone import load_backbone
from e2mc.checkpoints.export import (
    check_model_input,
    export_backbone,
    load_start_model,
    read_sidecar,
    sidecar_path,
)
from e2mc.checkpoints.io import UntrustedCheckpointError, torch_load
from e2mc.checkpoints.remote import checkpoint_of, fetch, is_url, local_checkpoint
from e2mc.checkpoints.strict import CheckpointMismatchError
from e2mc.checkpoints.summary import checkpoint_summary, recorded_image_size

__all__ = ["CheckpointMismatchError", "UntrustedCheckpointError", "check_model_input",
           "checkpoint_of", "checkpoint_summary", "export_backbone", "fetch", "is_url",
           "load_backbone", "load_checkpoint", "load_official", "load_start_model",
           "local_checkpoint", "read_sidecar", "recorded_image_size", "restore_optimizer_state",
           "save_checkpoint", "sidecar_path", "torch_load"]
