"""Reads for the decode calculator: a rig's model and memory as its latest sample saw them, and its finished turns.

Nothing here touches a backend: the sampler already read the model's geometry (GGUF header or /api/show), its
file size and parameter count, the host's memory and the GPUs; the rig's bandwidth is its ``RigProfile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from inference.models import Rig, Turn
from monitoring import selectors
from monitoring.calculator import presets
from monitoring.models import RigProfile

GIB = 2**30
MAX_POINTS = 500
# NVML device names -> GPU presets (presets.DEVICES), checked in this order.
NVML_MODELS = {"RTX 3090": "rtx-3090", "RTX 4090": "rtx-4090", "A100": "a100-80gb", "H100": "h100-sxm", "H200": "h200"}


@dataclass(frozen=True)
class RigFacts:
    """What the calculator's "this rig" presets fill, and why a part is missing (``model_error``)."""

    rig_id: int
    name: str
    model: dict[str, Any] = field(default_factory=dict)
    model_error: str = ""
    hw: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.rig_id,
            "name": self.name,
            "model": self.model,
            "model_error": self.model_error,
            "hw": self.hw,
            "host": self.host,
            "source": self.source,
        }


def _layer_kinds(arch: dict[str, Any]) -> dict[str, Any]:
    """The calculator's layer kinds from a rig's architecture: Ollama's per-layer list (kv heads, key, value,
    window, state), or llama-server's counts (inference/backends/llamacpp/monitor.py ``arch_summary``). Layers with
    no cache at all (NextN, shared-KV) are left out of ``layers``."""
    per_layer = arch.get("layers")
    if per_layer:
        rows = [(int(r[0]), int(r[3]) if len(r) > 3 else 0, int(r[4]) if len(r) > 4 else 0) for r in per_layer]
        sliding = [w for heads, w, _ in rows if heads and w]
        states = [state for heads, _, state in rows if state and not heads]
        cached = sum(1 for heads, _, state in rows if heads or state)
        window, recurrent, state = max(sliding, default=0), len(states), max(states, default=0)
    elif "sliding_layers" in arch:
        sliding = [0] * int(arch["sliding_layers"])
        window, recurrent = int(arch.get("window") or 0), int(arch.get("recurrent_layers") or 0)
        state = int(arch.get("state_bytes") or 0)
        cached = int(arch.get("attention_layers") or arch["block_count"]) + recurrent
    else:
        return {}
    return {
        "layers": cached or arch["block_count"],
        "sliding_layers": len(sliding) or None,
        "window": window or None,
        "recurrent_layers": recurrent or None,
        "state_mib": round(state / 2**20, 6) if recurrent else None,
    }


def _model_fields(detail: dict[str, Any], series: dict[str, Any]) -> tuple[dict[str, Any], str]:
    kv = detail.get("kv") or {}
    arch = kv.get("arch")
    loaded = detail.get("loaded_models") or []
    if not arch and loaded:
        arch = loaded[0].get("arch")
    if not arch:
        return {}, "the rig's latest sample has no model geometry (see its dashboard's KV panel)"
    head_dim = arch.get("key_length") or arch["embedding_length"] // arch["head_count"]
    fields: dict[str, Any] = {
        "layers": arch["block_count"],
        "heads": arch["head_count"],
        "kv_heads": arch["head_count_kv"],
        "embd": arch["embedding_length"],
        "head_dim": head_dim,
    }
    fields |= _layer_kinds(arch)
    if kv.get("params"):
        fields["params_b"] = kv["params"] / 1e9
    weight = series.get("weight_bytes") or (
        loaded[0].get("weight_bytes") or loaded[0].get("size_bytes") if loaded else None
    )
    if weight:
        fields["weight_gib"] = round(weight / GIB, 6)
    if kv.get("cache_type"):
        fields["kv_type"] = kv["cache_type"]
    return fields, ""


def gpu_preset(name: str) -> str | None:
    """The GPU preset whose model NVML's device name contains ("NVIDIA GeForce RTX 4090" -> rtx-4090)."""
    return next((key for model, key in NVML_MODELS.items() if model in name.upper()), None)


def _memory_fields(
    series: dict[str, Any], gpus: list[dict[str, Any]], bandwidth_gbs: float | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU rig: VRAM and its peak bandwidth from NVML (else the spec sheet of the GPU NVML names, which also gives
    compute and power), and the measured bandwidth is its system RAM's. A CPU rig: its RAM is the fast tier."""
    host_gib = round(series["host_total_bytes"] / GIB, 2) if series.get("host_total_bytes") else None
    gpu_bytes = series.get("gpu0_memory_total_bytes")
    if gpu_bytes:
        preset = gpu_preset(str(gpus[0].get("name", ""))) if gpus else None
        hw = {**presets.DEVICES[preset].fields()} if preset else {"reserved_gib": presets.CUDA_RESERVED_GIB}
        hw["vram_gib"] = round(gpu_bytes / GIB, 2)
        if gpus and gpus[0].get("memory_bandwidth_gbs"):  # NVML's peak: memory clock x bus width
            hw["vram_gbs"] = round(float(gpus[0]["memory_bandwidth_gbs"]), 1)
        host = {"ram_gib": host_gib} if host_gib else {}
        if bandwidth_gbs:
            host["ram_gbs"] = bandwidth_gbs
        return hw, host
    hw = {"vram_gib": host_gib} if host_gib else {}
    if bandwidth_gbs:
        hw["vram_gbs"] = bandwidth_gbs
    hw["reserved_gib"] = 0
    return hw, {"ram_gib": 0, "ram_gbs": 0}


def rig_facts(rig: Rig) -> RigFacts:
    latest = selectors.rig_latest(rig) or {"series": {}, "detail": {}}
    profile = RigProfile.objects.filter(rig=rig).first()
    bandwidth = profile.bandwidth_gbs if profile else None
    model, error = _model_fields(latest["detail"], latest["series"])
    gpus = latest["detail"].get("gpus") or []
    hw, host = _memory_fields(latest["series"], gpus, bandwidth)
    source = (
        f"{rig.name}: bandwidth {bandwidth} GB/s ({profile.get_bandwidth_source_display()})"
        if (profile and bandwidth)
        else f"{rig.name}: no bandwidth measured (manage.py rigdash_bandwidth {rig.name})"
    )
    on_gpu = bool(gpus) and bool(latest["series"].get("gpu0_memory_total_bytes"))
    preset = gpu_preset(str(gpus[0].get("name", ""))) if on_gpu else None
    if preset:
        source += f"; {gpus[0]['name']}: {presets.DEVICES[preset].source}"
    return RigFacts(rig.pk, rig.name, model, error, hw, host, source)


def enabled_rigs() -> list[Rig]:
    return list(Rig.objects.filter(enabled=True).order_by("name"))


@dataclass(frozen=True)
class TurnPoint:
    """One finished turn as a measured point: its decode rate, its mean context while decoding, and how many
    of the rig's turns were decoding at its midpoint (itself included)."""

    turn_id: int
    decode_tps: float
    context_tokens: float
    sessions: int
    model: str


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value else 0.0


def turn_points(rig: Rig, *, limit: int = MAX_POINTS) -> list[TurnPoint]:
    rows = list(
        Turn.objects.filter(
            rig=rig,  # the rig that ran it
            status=Turn.Status.DONE,
            started_at__isnull=False,
            finished_at__isnull=False,
            stats__has_key="decode_tps",
        )
        .filter(~Q(stats__decode_tps=None))
        .order_by("-finished_at")
        .values("id", "started_at", "finished_at", "stats", "session__model_name")[:limit]
    )
    spans = [(_epoch(row["started_at"]), _epoch(row["finished_at"])) for row in rows]
    points = []
    for row, (start, end) in zip(rows, spans, strict=True):
        stats = row["stats"]
        context = stats.get("context_tokens")
        if not context:
            continue
        # The context grows by one token a step: its mean over the reply is the end minus half the reply.
        mean_context = max(1.0, context - (stats.get("output_tokens") or 0) / 2)
        middle = (start + end) / 2
        sessions = sum(1 for s, e in spans if s <= middle <= e)
        points.append(
            TurnPoint(row["id"], float(stats["decode_tps"]), mean_context, max(1, sessions), row["session__model_name"])
        )
    points.reverse()
    return points
