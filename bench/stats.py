"""Pure figures for the benchmark: percentiles, rates, token alignment, Redis and CPU deltas, the table.

Definitions follow ../shared/reference/performance.md (copied into docs/benchmarks.md): TTFT is request
sent -> first non-empty token received; the decode rate is (n - 1) / (t_last - t_first); display lag is
the time a token is painted minus the time the same token reached a client reading the backend directly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """n, mean, min, p50, p95, p99, max of ``values`` (all None but n when empty)."""
    if not values:
        return {"n": 0, "mean": None, "min": None, "p50": None, "p95": None, "p99": None, "max": None}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(values),
        "mean": r(sum(values) / len(values)),
        "min": r(min(values)),
        "p50": r(percentile(values, 50)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values)),
    }


def decode_rate(times: Sequence[float]) -> float | None:
    """(n - 1) / (t_last - t_first) over one reply's token arrival times (seconds); None under 2 tokens."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def ttft_ms(t_send: float, times: Sequence[float]) -> float | None:
    return None if not times else (times[0] - t_send) * 1000


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return percentile(kept, 50)


def utf16_len(text: str) -> int:
    """Length as JavaScript counts it (UTF-16 code units), to match the page's string lengths."""
    return len(text.encode("utf-16-le")) // 2


def cumulative_utf16_ends(texts: Sequence[str]) -> list[int]:
    """For token k (0-based), the JavaScript length of the reply up to and including it."""
    ends: list[int] = []
    total = 0
    for text in texts:
        total += utf16_len(text)
        ends.append(total)
    return ends


def first_covering(ends: Sequence[int], shown: Sequence[tuple[float, int]]) -> list[float | None]:
    """For each token end, the time of the first display event (time, shown length) covering it.

    ``shown`` must be in time order; a token counts as shown once a displayed length reaches its end.
    """
    out: list[float | None] = []
    best_len = -1
    times: list[float] = []
    lengths: list[int] = []
    for t, length in shown:  # keep only events that show more than any before (the frontier)
        if length > best_len:
            best_len = length
            times.append(t)
            lengths.append(length)
    j = 0
    for end in ends:
        while j < len(lengths) and lengths[j] < end:
            j += 1
        out.append(times[j] if j < len(lengths) else None)
    return out


@dataclass(frozen=True)
class Delivery:
    """What one client received of a turn's token batches, checked against the seq contract."""

    arrivals: list[float]  # arrival time of seq k at index k - 1
    text: str
    in_order: bool
    gaps: int
    duplicates: int
    last_seq: int


def seq_delivery(batches: Sequence[tuple[float, int, int, str]]) -> Delivery:
    """Per-seq arrival times from (arrival, seq_from, seq_to, text) batches in the order received."""
    arrivals: list[float] = []
    parts: list[str] = []
    in_order, gaps, duplicates, last = True, 0, 0, 0
    for arrived, seq_from, seq_to, text in batches:
        if seq_to <= last:
            duplicates += 1
            in_order = False
            continue
        if seq_from != last + 1:
            gaps += 1
            in_order = False
            if seq_from <= last:  # overlaps what we hold: keep only the new seqs' times (text unknown)
                seq_from = last + 1
        arrivals.extend([arrived] * (seq_to - seq_from + 1))
        parts.append(text)
        last = seq_to
    return Delivery(arrivals, "".join(parts), in_order, gaps, duplicates, last)


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept); None with fewer than 2 distinct xs."""
    n = len(xs)
    if n < 2 or n != len(ys):
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def growth(values: Sequence[float], *, per: float = 1000.0) -> dict[str, Any]:
    """Does a per-token series grow over a reply? Slope per ``per`` tokens and p50 of first vs last tenth."""
    n = len(values)
    if n < 20:
        return {"n": n, "slope_per_1000": None, "first_tenth_p50": None, "last_tenth_p50": None}
    fit = linear_fit([float(i) for i in range(n)], list(values))
    tenth = max(1, n // 10)
    return {
        "n": n,
        "slope_per_1000": None if fit is None else round(fit[0] * per, 3),
        "first_tenth_p50": round(percentile(values[:tenth], 50) or 0.0, 3),
        "last_tenth_p50": round(percentile(values[-tenth:], 50) or 0.0, 3),
    }


def command_calls(info: dict[str, Any] | str) -> dict[str, int]:
    """Calls per command from INFO commandstats (redis-py's parsed dict, or the raw text)."""
    calls: dict[str, int] = {}
    if isinstance(info, str):
        for match in re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", info, re.M):
            calls[match.group(1)] = int(match.group(2))
        return calls
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        if isinstance(value, dict) and "calls" in value:
            calls[name] = int(value["calls"])
    return calls


def calls_delta(
    before: dict[str, int], after: dict[str, int], *, exclude: Iterable[str] = ("info", "config|resetstat")
) -> dict[str, int]:
    """Commands run between two snapshots (the benchmark's own INFO calls left out), largest first."""
    skip = set(exclude)
    delta = {cmd: after.get(cmd, 0) - before.get(cmd, 0) for cmd in set(before) | set(after) if cmd not in skip}
    return dict(sorted(((c, d) for c, d in delta.items() if d > 0), key=lambda item: -item[1]))


def cpu_seconds(times: Iterable[tuple[float, float]]) -> float:
    """Sum of (user, system) CPU seconds over processes."""
    return sum(user + system for user, system in times)


def steal_share(steal_s: float, wall_s: float, ncpu: int) -> float | None:
    """The share of the machine's CPU time (``ncpu`` cores over ``wall_s``) that the hypervisor took (steal)."""
    if wall_s <= 0 or ncpu <= 0:
        return None
    return max(0.0, steal_s) / (wall_s * ncpu)


def fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{unit}"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (also readable as plain text)."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "MISS")
