"""Metrics of sparse models: density, support selection and recovery, inference MACs."""

from fedlightning.metrics.inference_cost import LayerCost, count_macs
from fedlightning.metrics.sparsity import (
    density,
    num_kept,
    selected_input_features,
    support_recovery,
    top_m_mask,
)

__all__ = [
    "LayerCost",
    "count_macs",
    "density",
    "num_kept",
    "selected_input_features",
    "support_recovery",
    "top_m_mask",
]
