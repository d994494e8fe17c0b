"""Embedding diagnostics (docs/diagnostics.md)."""

from e2mc.diagnostics.embedding_stats import (
    SATURATION_TOL,
    EmbeddingStatistics,
    auh_uniformity,
    effective_rank,
    embedding_statistics,
    marginal_values,
    nearest_neighbor_distances,
    nn_overlap,
)
from e2mc.diagnostics.figures import (
    plot_accuracy_curves,
    plot_loss_terms,
    plot_marginal_pair,
    plot_nn_histograms,
)
from e2mc.diagnostics.report import RunDiagnostics, write_report

__all__ = ["SATURATION_TOL", "EmbeddingStatistics", "RunDiagnostics", "auh_uniformity",
           "effective_rank", "embedding_statistics", "marginal_values",
           "nearest_neighbor_distances", "nn_overlap", "plot_accuracy_curves", "plot_loss_terms",
           "plot_marginal_pair", "plot_nn_histograms", "write_report"]
