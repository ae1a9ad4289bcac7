"""The numbers of a benchmark: quantiles, summaries, ratios, and how a table cell shows them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

SLOW_S = 1.0  # seconds: past this, a query is timed fewer times


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation, like percentile_cont."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, mean, p50, p99 and max of a sample."""
    if not values:
        return {"n": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table cell."""
    if math.isnan(seconds):
        return "-"
    value = seconds * 1000
    if abs(value) >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.2f} ms" if abs(value) < 10 else f"{value:.1f} ms"


def ratio(value: float) -> str:
    """A ratio for a table cell."""
    if math.isnan(value) or math.isinf(value):
        return "-"
    if value >= 100:
        return f"{value:,.0f}x"
    return f"{value:.2f}x"


def safe_div(a: float, b: float) -> float:
    """a / b, NaN when b is 0."""
    return a / b if b else math.nan


def size_text(n: int) -> str:
    """Bytes as MiB or KiB for a note."""
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 1024:,.0f} KiB"


def slow_enough(times: Sequence[float]) -> bool:
    """True once a query timed ``times`` has run at least 3 times and over ``3 * SLOW_S`` seconds
    in all: a slow query gets fewer runs, its median still from 3."""
    return len(times) >= 3 and sum(times) > SLOW_S * 3
