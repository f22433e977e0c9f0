"""Summary statistics for logged metrics."""

from __future__ import annotations

import statistics
from typing import Sequence


def get_std_min_max_avg(name: str, data: Sequence[float], metrics_dict: dict[str, float]) -> dict[str, float]:
    """Add ``{name}_mean``, ``_std`` (population), ``_max`` and ``_min`` of `data`."""
    metrics_dict[f"{name}_mean"] = statistics.fmean(data)
    metrics_dict[f"{name}_std"] = statistics.pstdev(data)
    metrics_dict[f"{name}_max"] = max(data)
    metrics_dict[f"{name}_min"] = min(data)
    return metrics_dict
