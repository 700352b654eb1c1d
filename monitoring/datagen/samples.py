"""Rig samples at the retention the product keeps: 1 s samples (5 s while idle, as the sampler paces itself) for
the raw window, and one 60 s average per minute for the downsampled window (monitoring/services.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from monitoring.datagen.timeline import Timeline
from monitoring.datagen.turns import CONTEXT_LIMIT, RigShape

SAMPLE_COLUMNS = ("rig_id", "ts", "resolution_s", "series", "detail")
GIB = 1024**3
SLOTS = 4
KV_PER_TOKEN = 36864.0


def series(rng: random.Random, rig: RigShape, busy: float) -> dict[str, float]:
    """The flat numbers of one llama.cpp rig reading with ``busy`` slots decoding (a float for averages)."""
    tps = busy * rig.tps * rng.uniform(0.9, 1.0)
    context = busy * rng.uniform(200, 3000)
    return {
        "llamacpp_prompt_tokens_total": rng.uniform(1e5, 1e7), "llamacpp_tokens_predicted_total": rng.uniform(1e5, 1e7),
        "llamacpp_requests_processing": busy, "llamacpp_requests_deferred": 0.0,
        "llamacpp_n_decode_total": rng.uniform(1e5, 1e7), "llamacpp_n_busy_slots_per_decode": max(1.0, busy),
        "llamacpp_prompt_tokens_seconds": rig.tps * 25, "llamacpp_predicted_tokens_seconds": rig.tps,
        "decode_tps": round(tps, 3), "busy_slots": busy, "total_slots": float(SLOTS), "deferred_requests": 0.0,
        "kv_bytes_per_token": KV_PER_TOKEN, "kv_used_bytes": context * KV_PER_TOKEN,
        "kv_allocated_bytes": CONTEXT_LIMIT * KV_PER_TOKEN, "context_tokens": context,
        "host_total_bytes": 64.0 * GIB, "host_used_bytes": rng.uniform(20, 24) * GIB,
        "host_available_bytes": rng.uniform(40, 44) * GIB, "host_swap_used_bytes": 0.0,
        "gpu0_memory_used_bytes": 30.0 * GIB, "gpu0_memory_total_bytes": 80.0 * GIB,
        "gpu0_memory_reserved_bytes": 0.5 * GIB, "gpu0_utilization_pct": min(100.0, busy * 30),
        "gpu0_power_w": 90 + busy * 60, "gpu0_temperature_c": 40 + busy * 5,
        "weight_bytes": 4.1 * GIB, "backend_rss_bytes": 1.2 * GIB, "backend_vram_bytes": 29.5 * GIB,
        "queue_depth": 0.0, "active_turns": busy, "bound_tps": rig.tps * 1.4,
    }  # fmt: skip


def detail(rng: random.Random, rig: RigShape, busy: int) -> str:
    """A raw sample's per-slot, per-turn and per-source state, as JSON."""
    slots = [
        {"id": i, "phase": "decoding" if i < busy else "idle", "n_ctx": CONTEXT_LIMIT // SLOTS,
         "context_tokens": rng.randint(100, 1800) if i < busy else 0, "prompt_tokens": 300, "prompt_processed": 300,
         "decoded": rng.randint(1, 900) if i < busy else 0, "decode_tps": rig.tps if i < busy else 0.0,
         "kv_bytes": 0.0, "fill": 0.1}
        for i in range(SLOTS)
    ]  # fmt: skip
    ok = {"ok": True, "error": ""}
    turns = [
        {"id": 1000 + i, "status": "decoding", "user": f"gen-user-{i:03d}",
         "model": rig.model, "live": {"decode_tps": rig.tps, "tokens": 200}}
        for i in range(busy)
    ]  # fmt: skip
    return json.dumps(
        {
            "sources": {"backend": ok, "kv": ok, "host": ok, "gpu": ok, "process": ok, "queue": ok},
            "slots": slots, "model": rig.model, "turns": turns,
            "kv": {"cache_type": "f16", "arch": {"n_layer": 36, "n_head_kv": 8, "head_dim": 128}},
            "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 30 * GIB}],
            "process": {"pid": 4242, "rss_bytes": 1.2 * GIB, "vram_bytes": 29.5 * GIB},
            "placement": {"where": "gpu", "why": ""},
            "roofline": {"ok": True, "bandwidth_gbs": 4800.0, "streams": max(1, busy)},
        }
    )  # fmt: skip


def downsampled(rng: random.Random, rig: RigShape, timeline: Timeline, days: int) -> Iterator[tuple[Any, ...]]:
    now = timeline.now.replace(second=0, microsecond=0)
    for m in range(days * 1440, 0, -1):
        ts = now - timedelta(minutes=m)
        busy = min(float(SLOTS), timeline.weight_at(ts) * rng.uniform(0, 2.5))
        yield rig.id, ts, 60, json.dumps({k: round(v, 6) for k, v in series(rng, rig, busy).items()}), "{}"


def raw(rng: random.Random, rig: RigShape, timeline: Timeline, hours: float) -> Iterator[tuple[Any, ...]]:
    """Busy spells (1 s apart) and idle ones (5 s apart), their lengths drawn from the hour's activity."""
    details = {busy: [detail(rng, rig, busy) for _ in range(4 if busy else 1)] for busy in range(SLOTS + 1)}
    ts: datetime = timeline.now - timedelta(hours=hours)
    busy, spell_end = 0, ts
    while ts < timeline.now:
        if ts >= spell_end:
            activity = timeline.weight_at(ts)
            busy = rng.randint(1, SLOTS) if rng.random() < min(0.9, activity * 0.5) else 0
            spell_end = ts + timedelta(seconds=rng.expovariate(1 / (180 if busy else 420)))
        values = series(rng, rig, float(busy))
        yield rig.id, ts, 1, json.dumps(values), rng.choice(details[busy])
        ts += timedelta(seconds=1 if busy else 5)
