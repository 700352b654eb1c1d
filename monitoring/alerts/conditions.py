"""Each rule kind's condition over one rig's sample (and, for two kinds, the rig's recent turns): pure functions of
plain data, so each is tested without a database or a network."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# What a backend's error says when its model did not load (llama-server's, Ollama's words; failures.py's kinds).
LOAD_FAILURE = re.compile(r"fail\w* to load|load(ing)? (the )?model|error loading|out of memory|\boom\b|unable to load",
                          re.IGNORECASE)  # fmt: skip
GPU_TEMPERATURE = re.compile(r"gpu\d+_temperature_c")


@dataclass(frozen=True)
class Reading:
    """Whether the condition holds now, the figure it compared, and a line for people."""

    bad: bool
    value: float | None
    message: str


@dataclass(frozen=True)
class Facts:
    """What a condition may look at: the sample, and the rig's recent turns' figures (None: not asked)."""

    series: Mapping[str, Any]
    detail: Mapping[str, Any]
    has_agent: bool = False
    queue_wait_p95_s: float | None = None
    error_rate: float | None = None
    finished_turns: int = 0
    disk_used_pct: float | None = None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def spill(facts: Facts, threshold: float | None) -> Reading:
    placement = facts.detail.get("placement") or {}
    label = str(placement.get("label") or "")
    return Reading(placement.get("spill") is True, 1.0 if placement.get("spill") else 0.0, label or "no spill")


def agent_down(facts: Facts, threshold: float | None) -> Reading:
    agent = facts.detail.get("agent")
    if not facts.has_agent or not isinstance(agent, Mapping):
        return Reading(False, None, "the rig has no agent")
    up = bool(agent.get("up"))
    why = agent.get("error") or "no heartbeat"
    return Reading(not up, 0.0 if not up else 1.0, "agent up" if up else f"agent down: {why}")


def _backend(facts: Facts) -> Mapping[str, Any]:
    backend = (facts.detail.get("sources") or {}).get("backend")
    return backend if isinstance(backend, Mapping) else {}


def backend_down(facts: Facts, threshold: float | None) -> Reading:
    backend = _backend(facts)
    ok = bool(backend.get("ok"))
    return Reading(not ok, 1.0 if ok else 0.0, "backend up" if ok else f"backend down: {backend.get('error') or '?'}")


def model_load_failed(facts: Facts, threshold: float | None) -> Reading:
    error = str(_backend(facts).get("error") or "")
    failed = bool(LOAD_FAILURE.search(error))
    return Reading(failed, 1.0 if failed else 0.0, f"model not loaded: {error}" if failed else "model loaded")


def _above(value: float | None, threshold: float | None, what: str, unit: str) -> Reading:
    if value is None or threshold is None:
        return Reading(False, value, f"{what}: not measured" if value is None else f"{what}: no threshold set")
    bad = value >= threshold
    return Reading(bad, value, f"{what} {value:g}{unit} ({'at or above' if bad else 'below'} {threshold:g}{unit})")


def queue_wait_p95(facts: Facts, threshold: float | None) -> Reading:
    return _above(facts.queue_wait_p95_s, threshold, "queue wait p95", " s")


def slots_saturated(facts: Facts, threshold: float | None) -> Reading:
    busy, total = _number(facts.series.get("busy_slots")), _number(facts.series.get("total_slots"))
    fraction = busy / total if busy is not None and total else None
    return _above(fraction, 1.0 if threshold is None else threshold, "busy slots / slots", "")


def error_rate(facts: Facts, threshold: float | None) -> Reading:
    rate = facts.error_rate if facts.finished_turns else None
    return _above(rate, threshold, f"failed turns / finished ({facts.finished_turns})", "")


def gpu_temperature(facts: Facts, threshold: float | None) -> Reading:
    temps = [v for k, v in facts.series.items() if GPU_TEMPERATURE.fullmatch(k) and _number(v) is not None]
    return _above(max(temps) if temps else None, threshold, "hottest GPU", " °C")


def disk(facts: Facts, threshold: float | None) -> Reading:
    return _above(facts.disk_used_pct, threshold, "disk used", " %")


CONDITIONS: dict[str, Callable[[Facts, float | None], Reading]] = {
    "spill": spill,
    "agent_down": agent_down,
    "backend_down": backend_down,
    "model_load_failed": model_load_failed,
    "queue_wait_p95": queue_wait_p95,
    "slots_saturated": slots_saturated,
    "error_rate": error_rate,
    "gpu_temperature": gpu_temperature,
    "disk": disk,
}


@dataclass
class Track:
    """Hysteresis of one rule on one rig: since when the condition has held, or been clear, without a break."""

    bad_since: float | None = None
    good_since: float | None = None


def step(track: Track, *, bad: bool, firing: bool, now: float, for_s: float, clear_s: float) -> str | None:
    """Advance ``track`` by one reading; "fire" when the condition has held ``for_s`` (not firing yet), "resolve"
    when it has been clear ``clear_s`` (firing), else None. A reading the other way restarts the other clock, so a
    condition that flaps faster than the durations neither fires nor resolves."""
    if bad:
        track.good_since = None
        track.bad_since = now if track.bad_since is None else track.bad_since
        if not firing and now - track.bad_since >= for_s:
            return "fire"
        return None
    track.bad_since = None
    track.good_since = now if track.good_since is None else track.good_since
    if firing and now - track.good_since >= clear_s:
        return "resolve"
    return None
