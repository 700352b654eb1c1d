"""The latest sample of every rig in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

from typing import Any

# series name -> (metric name, help)
GAUGES = {
    "decode_tps": ("rigdash_decode_tokens_per_second", "Decode tokens/s of the rig, all slots together"),
    "bound_tps": ("rigdash_decode_bound_tokens_per_second", "Memory-bandwidth bound on decode tokens/s"),
    "roofline_ratio": ("rigdash_roofline_ratio", "Measured decode tokens/s over the bandwidth bound"),
    "busy_slots": ("rigdash_busy_slots", "Backend slots processing a request"),
    "total_slots": ("rigdash_slots", "Backend slots"),
    "deferred_requests": ("rigdash_deferred_requests", "Requests the backend deferred (all slots busy)"),
    "queue_depth": ("rigdash_queue_depth", "Turns waiting in the rig's Celery queue"),
    "active_turns": ("rigdash_active_turns", "Turns queued or running on the rig"),
    "context_tokens": ("rigdash_context_tokens", "Tokens held in the backend's context, all slots"),
    "kv_bytes_per_token": ("rigdash_kv_bytes_per_token", "KV-cache bytes per token of context"),
    "kv_used_bytes": ("rigdash_kv_used_bytes", "KV-cache bytes holding tokens now"),
    "kv_allocated_bytes": ("rigdash_kv_allocated_bytes", "KV-cache bytes allocated (all slots' context)"),
    "weight_bytes": ("rigdash_model_weight_bytes", "Model weight bytes"),
    "host_used_bytes": ("rigdash_host_memory_used_bytes", "System RAM in use"),
    "host_total_bytes": ("rigdash_host_memory_total_bytes", "System RAM"),
    "backend_rss_bytes": ("rigdash_backend_resident_bytes", "Resident memory of the backend process"),
    "backend_vram_bytes": ("rigdash_backend_vram_bytes", "GPU memory NVML attributes to the backend process"),
    "llamacpp_tokens_predicted_total": ("rigdash_backend_tokens_predicted_total", "Backend counter of decoded tokens"),
    "llamacpp_prompt_tokens_total": ("rigdash_backend_prompt_tokens_total", "Backend counter of prompt tokens"),
}
GPU_GAUGES = {
    "memory_used_bytes": ("rigdash_gpu_memory_used_bytes", "GPU memory used"),
    "memory_total_bytes": ("rigdash_gpu_memory_total_bytes", "GPU memory"),
    "memory_reserved_bytes": ("rigdash_gpu_memory_reserved_bytes", "GPU memory the driver reserves for itself"),
    "utilization_pct": ("rigdash_gpu_utilization_percent", "GPU utilisation"),
    "power_w": ("rigdash_gpu_power_watts", "GPU power draw"),
    "temperature_c": ("rigdash_gpu_temperature_celsius", "GPU temperature"),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def render(rigs: list[dict[str, Any]]) -> str:
    """``rigs``: [{"name", "model", "up", "series", "turns_by_user"}] -> exposition text."""
    lines: list[str] = []

    def family(metric: str, help_text: str, rows: list[tuple[str, float]]) -> None:
        if rows:
            lines.extend([f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"])
            lines.extend(f"{metric}{labels} {value:g}" for labels, value in rows)

    family("rigdash_rig_up", "1 when RigDash's last sample reached the rig's backend",
           [(_labels(rig=r["name"], model=r["model"]), 1.0 if r["up"] else 0.0) for r in rigs])  # fmt: skip
    for key, (metric, help_text) in GAUGES.items():
        rows = [
            (_labels(rig=r["name"], model=r["model"]), float(r["series"][key]))
            for r in rigs
            if isinstance(r["series"].get(key), int | float)
        ]
        family(metric, help_text, rows)
    for key, (metric, help_text) in GPU_GAUGES.items():
        rows = []
        for r in rigs:
            for name, value in r["series"].items():
                if name.startswith("gpu") and name.endswith("_" + key):
                    gpu = name[3 : -len(key) - 1]
                    rows.append((_labels(rig=r["name"], model=r["model"], gpu=gpu), float(value)))
        family(metric, help_text, rows)
    family("rigdash_active_turns_by_user", "Turns queued or running, by user",
           [(_labels(rig=r["name"], model=r["model"], user=user), float(count))
            for r in rigs for user, count in r["turns_by_user"].items()])  # fmt: skip
    return "\n".join(lines) + "\n"
