"""Plotly figure dicts for the calculator: predicted tokens/s against context and against sessions, the spill point
marked, a rig's finished turns as measured points on the same axes, and the reading pace as a reference line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitoring.calculator import model as calc
from monitoring.calculator.selectors import TurnPoint

BASE: dict[str, Any] = {
    "margin": {"l": 55, "r": 55, "t": 35, "b": 40},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"},
}


def _marks(spill: int | None, no_fit: int | None, ladder: list[int], top_tps: float) -> list[dict[str, Any]]:
    """Vertical lines where the footprint first spills and first does not fit, and the reading pace, as traces
    (a trace takes data coordinates on a log axis as on a linear one)."""
    traces: list[dict[str, Any]] = []
    height = max(top_tps, calc.READING_TPS) * 1.05
    for x, name, color in ((spill, "spills to system RAM", "#b54708"), (no_fit, "does not fit", "#b42318")):
        if x is not None and x <= ladder[-1]:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"{name} ({x})",
                    "x": [x, x],
                    "y": [0, height],
                    "line": {"color": color, "dash": "dash"},
                    "hoverinfo": "name",
                }
            )
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"reading pace ({calc.READING_TPS:.1f} tokens/s)",
            "x": [ladder[0], ladder[-1]],
            "y": [calc.READING_TPS] * 2,
            "line": {"color": "#667085", "dash": "dot"},
            "hoverinfo": "name",
        }
    )
    return traces


def _top(values: Sequence[float | None]) -> float:
    return max((v for v in values if v is not None), default=0.0)


MEASURED_NAME = "measured turns (tokens/s per session)"


def _measured(points: Sequence[TurnPoint], x: str, name: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": [p.context_tokens if x == "context" else p.sessions for p in points],
        "y": [p.decode_tps for p in points],
        "text": [f"turn {p.turn_id}: {p.model}, {p.sessions} decoding, context {p.context_tokens:.0f}" for p in points],
        "marker": {"size": 7, "color": "#d92d20", "opacity": 0.7},
    }


def _tps(rates: Sequence[calc.DecodeRate | None], total: bool = False) -> list[float | None]:
    return [None if r is None else round(r.total_tps if total else r.per_session_tps, 3) for r in rates]


def context_figure(
    model: calc.ModelSpec,
    hw: calc.Hardware,
    work: calc.Workload,
    prediction: calc.Prediction,
    points: Sequence[TurnPoint] = (),
    *,
    measured_name: str = MEASURED_NAME,
) -> dict[str, Any]:
    no_fit = (
        calc.max_context_for(
            capacity_bytes=hw.total_bytes,
            weight_bytes=model.weight_bytes,
            kv=calc.kv_sizer(model.arch, work.kv_type),
            sessions=work.sessions,
        )
        + 1
    )
    ladder = calc.context_ladder(work.context_tokens, marks=(prediction.spill_context, no_fit))
    rates = calc.curve(model, hw, work, contexts=ladder)
    per_session = _tps(rates)
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"predicted per session ({work.sessions} decoding)",
            "x": ladder,
            "y": per_session,
            "line": {"color": "#1570ef"},
        }
    ]
    if work.sessions > 1:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "predicted total",
                "x": ladder,
                "y": _tps(rates, total=True),
                "line": {"color": "#1570ef", "dash": "dash"},
            }
        )
    if points:
        data.append(_measured(points, "context", measured_name))
    data += _marks(prediction.spill_context, no_fit, ladder, _top(per_session))
    return {
        "data": data,
        "layout": {
            **BASE,
            "title": {"text": "Decode tokens/s against context per session", "font": {"size": 14}},
            "xaxis": {"type": "log", "title": {"text": "context per session (tokens)"}},
            "yaxis": {"title": {"text": "tokens/s"}, "rangemode": "tozero"},
        },
        "meta": {"spill_at": prediction.spill_context, "no_fit_at": no_fit},
    }


def sessions_figure(
    model: calc.ModelSpec,
    hw: calc.Hardware,
    work: calc.Workload,
    prediction: calc.Prediction,
    points: Sequence[TurnPoint] = (),
    *,
    measured_name: str = MEASURED_NAME,
) -> dict[str, Any]:
    no_fit = prediction.max_sessions_total + 1
    ladder = calc.sessions_ladder(work.sessions, marks=(prediction.spill_sessions, no_fit))
    rates = calc.curve(model, hw, work, sessions=ladder)
    per_session = _tps(rates)
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "predicted per session",
            "x": ladder,
            "y": per_session,
            "line": {"color": "#1570ef"},
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "predicted total (right axis)",
            "x": ladder,
            "y": _tps(rates, total=True),
            "yaxis": "y2",
            "line": {"color": "#039855", "dash": "dash"},
        },
    ]
    if points:
        data.append(_measured(points, "sessions", measured_name))
    data += _marks(prediction.spill_sessions, no_fit, ladder, _top(per_session))
    return {
        "data": data,
        "layout": {
            **BASE,
            "title": {
                "text": f"Decode tokens/s against sessions, {work.context_tokens} tokens each",
                "font": {"size": 14},
            },
            "xaxis": {"title": {"text": "concurrent sessions"}},
            "yaxis": {"title": {"text": "tokens/s per session"}, "rangemode": "tozero"},
            "yaxis2": {"title": {"text": "total tokens/s"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
        },
        "meta": {"spill_at": prediction.spill_sessions, "no_fit_at": no_fit},
    }


def with_measured(figure: dict[str, Any], name: str) -> dict[str, Any]:
    """The figure with a measured trace named ``name``, empty if it had none, for a page that adds points live."""
    if not any(trace.get("name") == name for trace in figure["data"]):
        figure["data"].append(_measured((), "context", name))
    return figure
