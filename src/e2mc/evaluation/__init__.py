"""Evaluation of frozen or fine-tuned backbones and paired statistics (paper step 3, app. C);
docs/evaluation.md lists the protocols."""

from __future__ import annotations

from e2mc.evaluation.batched import HeadSpec, train_linear_heads
from e2mc.evaluation.compare import compare_evaluations
from e2mc.evaluation.compare_report import comparison_markdown, write_comparison
from e2mc.evaluation.features import FeatureCache, extract_features
from e2mc.evaluation.finetune import finetune
from e2mc.evaluation.knn import KNNResult, knn_classify
from e2mc.evaluation.linear import ProbeResult, train_augmented_linear_probe
from e2mc.evaluation.probe_settings import (
    FinetuneConfig,
    LinearProbeConfig,
    finetune_settings,
    linear_settings,
)
from e2mc.evaluation.runner import EvalOptions
from e2mc.evaluation.significance import (
    bootstrap_difference_ci,
    cohens_d_paired,
    compare_predictions,
    mcnemar_test,
    paired_permutation_test,
    pooled_permutation_test,
)
from e2mc.evaluation.svm import VOC07_COSTS, SVMResult, svm_transfer
from e2mc.evaluation.sweep import SweepEntry, linear_protocol, validation_split
from e2mc.evaluation.workflow import EvalData, evaluate_module

__all__ = [
    "VOC07_COSTS", "EvalData", "EvalOptions", "FeatureCache", "FinetuneConfig", "HeadSpec",
    "KNNResult", "LinearProbeConfig", "ProbeResult", "SVMResult", "SweepEntry",
    "bootstrap_difference_ci", "cohens_d_paired", "compare_predictions", "compare_evaluations",
    "comparison_markdown", "evaluate_module", "extract_features", "finetune", "finetune_settings",
    "knn_classify", "linear_settings", "linear_protocol", "mcnemar_test",
    "paired_permutation_test", "pooled_permutation_test", "svm_transfer",
    "train_augmented_linear_probe", "train_linear_heads", "validation_split", "write_comparison",
]
