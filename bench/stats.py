"""Pure statistics of the benchmark: medians, percentiles, ratios of paired runs."""

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """The pct-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile {pct} is outside 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def paired_ratios(values: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """values[i] / baseline[i]: each repeat compared with the baseline measured next to it."""
    if len(values) != len(baseline):
        raise ValueError("paired ratios need as many values as baseline runs")
    return [v / b for v, b in zip(values, baseline, strict=True)]


def median(values: Sequence[float]) -> float:
    """The median; robust to the odd run that another process on the machine slowed down."""
    return float(statistics.median(values))
