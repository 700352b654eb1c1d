"""Decode arithmetic as plain functions: the bandwidth roofline, percentiles, counter rates.

The KV-cache arithmetic the roofline needs is the backends' (inference/backends/kvcache.py): each backend's monitor
sizes its own cache with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from inference.backends.kvcache import (
    KV_CACHE_TYPE_BYTES,
    KV_PAD,
    UBATCH,
    kv_allocated_bytes,
    kv_bytes,
    kv_bytes_per_token,
    kv_cells,
    ollama_kv_cache_type,
)

__all__ = [
    "KV_CACHE_TYPE_BYTES", "KV_PAD", "UBATCH", "decode_bound_tps", "kv_allocated_bytes", "kv_bytes",
    "kv_bytes_per_token", "kv_cells", "ollama_kv_cache_type", "percentile", "rate_from_counters",
]  # fmt: skip


def decode_bound_tps(*, bandwidth_bytes_s: float, weight_bytes: float, kv_bytes_read: float = 0.0) -> float:
    """Upper bound on tokens/s: each token reads the weights and the KV cache in use once."""
    return bandwidth_bytes_s / (weight_bytes + kv_bytes_read)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rate_from_counters(previous: float | None, current: float | None, dt_s: float) -> float | None:
    """Per-second rate of a monotonic counter; None across a restart (counter went down) or no data."""
    if previous is None or current is None or dt_s <= 0 or current < previous:
        return None
    return (current - previous) / dt_s
