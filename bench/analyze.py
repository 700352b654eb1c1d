"""Pure per-turn figures: one RigDash turn against the direct reader of the same stream (the tap or source).

Inputs are plain data (times in seconds from ``time.time()``), so the same code serves every level and the
unit tests. Per token k (seq k): arrival at the direct reader ``ref[k]``, arrival at the websocket tab
``ws[k]`` (its batch's arrival), and the time the page had painted a reply at least as long as the text
through token k. Lags are in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import stats


def turn_figures(
    *,
    t_send: float,
    batches: Sequence[tuple[float, int, int, str]],
    ref_events: Sequence[tuple[float, str]],
    ref_t_request: float | None,
    stored_reply: str,
    flushes: Sequence[dict[str, Any]] | None = None,
    page_text: str | None = None,
) -> dict[str, Any]:
    """Figures for one turn; ``flushes`` are the page's renderer flushes (len, start, rendered, painted)."""
    delivery = stats.seq_delivery(batches)
    ref_times = [t for t, _ in ref_events]
    ref_texts = [x for _, x in ref_events]
    ref_text = "".join(ref_texts)
    n = len(ref_times)
    out: dict[str, Any] = {
        "tokens_backend": n,
        "tokens_delivered": delivery.last_seq,
        "in_order": delivery.in_order and delivery.gaps == 0 and delivery.duplicates == 0,
        "gaps": delivery.gaps,
        "duplicates": delivery.duplicates,
        "delivered_equals_stored": delivery.text == stored_reply,
        "stored_equals_backend": stored_reply == ref_text,
        "page_equals_stored": None if page_text is None else page_text == stored_reply,
        "ttft_ms": stats.ttft_ms(t_send, delivery.arrivals),
        "decode_tps": stats.decode_rate(delivery.arrivals),
        "ref_decode_tps": stats.decode_rate(ref_times),
    }
    out["decode_ratio_vs_ref"] = stats.ratio(out["decode_tps"], out["ref_decode_tps"])
    if ref_t_request is not None and ref_times and delivery.arrivals:
        out["ttft_parts_ms"] = {
            "to_backend": (ref_t_request - t_send) * 1000,  # websocket -> consumer -> Celery -> worker -> request
            "backend": (ref_times[0] - ref_t_request) * 1000,  # prompt processing, as the direct reader sees it
            "to_client": (delivery.arrivals[0] - ref_times[0]) * 1000,  # worker -> Redis -> web -> socket
        }
    m = min(n, len(delivery.arrivals))
    out["ws_lag_ms"] = [(delivery.arrivals[k] - ref_times[k]) * 1000 for k in range(m)]
    if flushes is not None:
        ends = stats.cumulative_utf16_ends(ref_texts)
        ordered = sorted((f for f in flushes if f.get("painted") is not None), key=lambda f: f["painted"])
        painted = stats.first_covering(ends, [(f["painted"], f["len"]) for f in ordered])
        out["display_lag_ms"] = [(p - ref_times[k]) * 1000 for k, p in enumerate(painted) if p is not None]
        out["tokens_painted"] = sum(p is not None for p in painted)
        out["render"] = render_series(flushes)
    return out


def render_series(flushes: Sequence[dict[str, Any]]) -> list[tuple[int, float, float | None]]:
    """(reply length, JS render ms, start -> painted ms) per flush: the renderer's cost as a reply grows."""
    series = []
    for f in flushes:
        painted = None if f.get("painted") is None else (f["painted"] - f["start"]) * 1000
        series.append((int(f["len"]), (f["rendered"] - f["start"]) * 1000, painted))
    return series


def render_flatness(series: Sequence[tuple[int, float, float | None]], *, max_len: int) -> dict[str, Any]:
    """Render time per flush by reply length: p50 in each fifth of ``max_len`` and the slope per 10k chars.

    ``p50_ms`` is the renderer's JavaScript (Markdown, sanitiser, DOM); ``frame_p50_ms`` runs from the flush
    to the end of that frame's rendering work (style, layout, paint)."""
    if not series:
        return {"bins": [], "slope_ms_per_10k_chars": None, "flushes": 0}
    fifth = max(1, max_len // 5)
    bins = []
    for i in range(5):
        lo, hi = i * fifth, (i + 1) * fifth
        inside = [s for s in series if lo <= s[0] < hi or (i == 4 and s[0] >= hi)]
        values = [ms for _, ms, _ in inside]
        frames = [f for _, _, f in inside if f is not None]
        bins.append({"chars": f"{lo}-{hi}", "flushes": len(values), "p50_ms": _r(stats.percentile(values, 50)),
                     "max_ms": _r(max(values) if values else None),
                     "frame_p50_ms": _r(stats.percentile(frames, 50))})  # fmt: skip
    fit = stats.linear_fit([float(length) for length, _, _ in series], [ms for _, ms, _ in series])
    return {
        "bins": bins,
        "slope_ms_per_10k_chars": None if fit is None else round(fit[0] * 10_000, 3),
        "flushes": len(series),
        "max_len": max(length for length, _, _ in series),
    }


def pair_ratios(rigdash: Sequence[dict[str, Any]], direct: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per pair (same prompt, seed, temperature 0): RigDash / direct decode and backend rates, added TTFT."""
    out: dict[str, list[float]] = {"decode": [], "backend": [], "added_ttft_ms": []}
    for rd, d in zip(rigdash, direct, strict=True):
        if (value := stats.ratio(rd.get("decode_tps"), d.get("decode_tps"))) is not None:
            out["decode"].append(value)
        if (value := stats.ratio(rd.get("backend_tps"), d.get("backend_tps"))) is not None:
            out["backend"].append(value)
        if rd.get("ttft_ms") is not None and d.get("ttft_ms") is not None:
            out["added_ttft_ms"].append(rd["ttft_ms"] - d["ttft_ms"])
    return out


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def place_longtask(task: dict[str, Any], flushes: list[dict[str, Any]]) -> dict[str, Any]:
    """A long task with where it fell in the browser's turn: how many of the turn's flushes had started before it,
    and its start relative to the first and the last flush (seconds), to tell the turn's start, its streaming
    and its end apart."""
    starts = sorted(f["start"] for f in flushes if f.get("start") is not None)
    if not starts:
        return task
    return {
        **task,
        "flushes_before": sum(1 for t in starts if t < task["start"]),
        "from_first_flush_s": round(task["start"] - starts[0], 4),
        "from_last_flush_s": round(task["start"] - starts[-1], 4),
    }
