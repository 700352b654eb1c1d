"""Decode arithmetic as plain functions: KV-cache bytes, the bandwidth roofline, percentiles.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element, with
head dim = key_length if the model states it, else embedding_length / head_count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from inference.backends.base import ModelArchitecture

# Bytes per element of llama.cpp's KV cache types (block formats: bytes per 32-element block / 32).
KV_CACHE_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


def kv_bytes_per_token(arch: ModelArchitecture, cache_type: str = "f16") -> float:
    try:
        element_bytes = KV_CACHE_TYPE_BYTES[cache_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {cache_type!r}; known: {sorted(KV_CACHE_TYPE_BYTES)}") from None
    key_dim = arch.key_length or arch.embedding_length // arch.head_count
    value_dim = arch.value_length or key_dim
    return arch.block_count * arch.head_count_kv * (key_dim + value_dim) * element_bytes


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
