"""Plotly figure dicts built from plain data (no Plotly import needed: the browser draws them).

Trace order is part of the contract with static/rigdash/dashboard.js, which extends traces live.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

GIB = 2**30
MAX_GAP_POINTS = 2000  # per turn, in the gap time series (the histogram takes them all)
LAYOUT: dict[str, Any] = {
    "margin": {"l": 50, "r": 10, "t": 30, "b": 35},
    "height": 260,
    "legend": {"orientation": "h", "y": -0.25},
    "xaxis": {"type": "date"},
}

# name in series -> (trace label, scale divisor); dashboard.js reads these from the figure's meta.
DECODE_TRACES = [("decode_tps", "rig decode tokens/s", 1), ("bound_tps", "bandwidth bound", 1)]
KV_TRACES = [("kv_used_bytes", "KV in use (MiB)", 2**20), ("kv_allocated_bytes", "KV allocated (MiB)", 2**20)]
MEMORY_TRACES = [
    ("host_used_bytes", "system RAM used (GiB)", GIB),
    ("host_total_bytes", "system RAM total (GiB)", GIB),
    ("backend_rss_bytes", "backend process RSS (GiB)", GIB),
    ("backend_vram_bytes", "backend process VRAM (GiB)", GIB),
    ("gpu0_memory_used_bytes", "GPU 0 memory used (GiB)", GIB),
]
ENERGY_TRACES = [
    ("energy_j_per_token", "joules per decoded token", 1),
    ("energy_bound_j_per_token", "at the bandwidth bound (the calculator's figure)", 1),
]
GPU_SERIES = re.compile(r"gpu(\d+)_memory_used_bytes")


def gpu_traces(columns: dict[str, Any]) -> list[tuple[str, str, float]]:
    """One pair of traces per GPU the range has samples of: its memory used, and what the backend holds there."""
    indexes = sorted(int(found[1]) for name in columns["series"] if (found := GPU_SERIES.fullmatch(name)))
    return [
        trace
        for i in indexes or [0]
        for trace in (
            (f"gpu{i}_memory_used_bytes", f"GPU {i} used (GiB)", GIB),
            (f"gpu{i}_backend_memory_bytes", f"GPU {i} backend (GiB)", GIB),
        )
    ]


def rig_series_figures(columns: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The rig page's time-series panels (dashboard.js extends each live from the samples)."""
    return {
        "decode": series_figure(columns, DECODE_TRACES, "Decode tokens/s (rig total) and the bandwidth bound"),
        "kv": series_figure(columns, KV_TRACES, "KV cache"),
        "memory": series_figure(columns, MEMORY_TRACES, "Memory"),
        "gpus": series_figure(columns, gpu_traces(columns), "Memory per GPU", hide_empty=True),
        "energy": series_figure(columns, ENERGY_TRACES, "Energy per token (GPU power / decode rate)", hide_empty=True),
    }


def _x(ts: list[float]) -> list[float]:
    return [t * 1000 for t in ts]  # Plotly date axes take milliseconds


def series_figure(
    columns: dict[str, Any], traces: Sequence[tuple[str, str, float]], title: str, *, hide_empty: bool = False
) -> dict[str, Any]:
    """A time-series panel; ``hide_empty``: the page hides it until a sample brings one of its series (a CPU rig has
    no per-GPU memory or energy to chart)."""
    data = []
    for name, label, scale in traces:
        values = columns["series"].get(name, [])
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "x": _x(columns["ts"]) if values else [],
                "y": [None if v is None else v / scale for v in values],
                "line": {"dash": "dash"} if name == "bound_tps" else {},
            }
        )
    return {
        "data": data,
        "layout": {**LAYOUT, "title": {"text": title, "font": {"size": 14}}},
        "meta": {"series": [[name, scale] for name, _, scale in traces], "hide_empty": hide_empty},
    }


def latency_figures(latency: dict[str, Any]) -> dict[str, dict[str, Any]]:
    gaps_x: list[int] = []
    gaps_y: list[float] = []
    all_gaps: list[float] = []
    index = 0
    for turn in latency["turns"]:
        for gap in turn["gaps_ms"][-MAX_GAP_POINTS:]:
            index += 1
            gaps_x.append(index)
            gaps_y.append(gap)
        all_gaps.extend(turn["gaps_ms"])
    shapes = []
    for key, color in (("p50_ms", "#067647"), ("p95_ms", "#b54708"), ("p99_ms", "#b42318")):
        if latency[key] is not None:
            shapes.append({"type": "line", "x0": latency[key], "x1": latency[key], "yref": "paper", "y0": 0, "y1": 1,
                           "line": {"color": color, "dash": "dot"}, "name": key})  # fmt: skip
    percentile_text = " · ".join(
        f"{key[:-3]} {latency[key]:.1f} ms" for key in ("p50_ms", "p95_ms", "p99_ms") if latency[key] is not None
    )
    base: dict[str, Any] = {"margin": LAYOUT["margin"], "height": 260}
    if not latency["turns"]:
        base["annotations"] = [{"text": "no finished turn yet", "showarrow": False, "xref": "paper", "yref": "paper",
                                "x": 0.5, "y": 0.5}]  # fmt: skip
    return {
        "gaps": {
            "data": [{"type": "scatter", "mode": "lines", "name": "gap (ms)", "x": gaps_x, "y": gaps_y}],
            "layout": {**base, "title": {"text": "Inter-token gaps, recent turns (ms)", "font": {"size": 14}},
                       "xaxis": {"title": {"text": "token"}}},
        },
        "histogram": {
            "data": [{"type": "histogram", "name": "gaps", "x": all_gaps, "nbinsx": 60}],
            "layout": {**base, "shapes": shapes,
                       "title": {"text": f"Gap histogram  {percentile_text}", "font": {"size": 14}},
                       "xaxis": {"title": {"text": "ms"}}},
        },
        "ttft": {
            "data": [{"type": "bar", "name": "TTFT (ms)", "x": [f"#{t['id']}" for t in latency["turns"]],
                      "y": [t["ttft_ms"] for t in latency["turns"]]}],
            "layout": {**base, "title": {"text": "Time to first token per turn (ms)", "font": {"size": 14}},
                       "xaxis": {"type": "category"}},
        },
    }  # fmt: skip


def dashboard_figures(columns: dict[str, Any], latency: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**rig_series_figures(columns), **latency_figures(latency)}
