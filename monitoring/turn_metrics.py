"""Totals of finished turns for the Prometheus export: latency histograms and counters, kept incrementally.

A finished turn (done, failed, cancelled, interrupted) never changes again, so each process folds it into its
totals once, and every process reports the same figures from the database. Turns are read in id order up to a
mark that stays on turns older than ``SETTLE_S`` (an insert's id may become visible after a larger one's); those
still queued or running then are remembered by id and folded once they finish. A scrape reads the turns of the
last ``SETTLE_S`` and of the queue, never the history again.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Max, Q
from django.utils import timezone
from prometheus_client.utils import floatToGoString

from inference.backends.llamacpp import chat as llamacpp
from inference.models import Turn

FINISHED = (Turn.Status.DONE, Turn.Status.FAILED, Turn.Status.CANCELLED, Turn.Status.INTERRUPTED)
SETTLE_S = 60.0  # longer than any transaction that inserts a turn stays open
FOLD_BATCH = 2000

# Upper bounds (seconds). CPU rigs decode a small model at 5-10 ms a token and a GPU at 1-5 ms, so the
# inter-token buckets start at 1 ms; first tokens and queue waits reach minutes on a loaded rig.
BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
    "itl": (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    "duration": (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
    "queue": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
}

RigModel = tuple[int, str]  # (rig id, model name)


@dataclass
class Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf) and the sum of observations."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value equal to a bound falls in it
        self.total += value

    def merged(self, other: Histogram) -> Histogram:
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        return Histogram(self.bounds, counts, self.total + other.total)

    def cumulative(self) -> list[tuple[str, int]]:
        """[(le, count)] as Prometheus exposes them, ending with +Inf."""
        out, running = [], 0
        for bound, count in zip([*map(floatToGoString, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _number(value: Any) -> float | None:
    """A finite, non-negative number from stored stats, or None (stats come from backends: untrusted)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < float("inf") else None


def draft_counts(stats: Mapping[str, Any]) -> tuple[int, int] | None:
    """(drafted, accepted) tokens of a turn's speculative decoding, from the backend timings stored in its stats
    (llama-server's ``draft_n``, ``draft_n_accepted``, sent only when a draft model drafted), else None."""
    timings = stats.get("backend_timings")
    if not isinstance(timings, dict):
        return None
    drafted, accepted = llamacpp.draft_counts(timings)
    return (drafted, accepted) if drafted and accepted is not None else None


@dataclass
class Totals:
    histograms: dict[tuple[str, RigModel], Histogram] = field(default_factory=dict)
    turns: Counter[tuple[int, str, str]] = field(default_factory=Counter)  # (rig, model, status)
    prompt_tokens: Counter[tuple[int, str, int]] = field(default_factory=Counter)  # (rig, model, user id)
    output_tokens: Counter[tuple[int, str, int]] = field(default_factory=Counter)
    draft_tokens: Counter[RigModel] = field(default_factory=Counter)
    draft_accepted_tokens: Counter[RigModel] = field(default_factory=Counter)
    # The requests of API keys (``ChatSession.api_key``), by key id: (key, status), and the tokens by key.
    key_requests: Counter[tuple[int, str]] = field(default_factory=Counter)
    key_prompt_tokens: Counter[int] = field(default_factory=Counter)
    key_output_tokens: Counter[int] = field(default_factory=Counter)

    def _observe(self, name: str, key: RigModel, values: Iterable[float]) -> None:
        histogram = self.histograms.get((name, key))
        if histogram is None:
            histogram = self.histograms[(name, key)] = Histogram(BUCKETS[name])
        for value in values:
            histogram.observe(value)

    def add(self, row: Mapping[str, Any]) -> None:
        """One finished turn: a ``values()`` row of ``TURN_FIELDS``."""
        # The rig that ran it; a turn that never reached one counts on its chat's rig.
        key: RigModel = (row["rig_id"] or row["session__rig_id"], row["session__model_name"])
        user_key = (*key, row["session__owner_id"])
        self.turns[(*key, row["status"])] += 1
        self.prompt_tokens[user_key] += row["prompt_tokens"] or 0
        self.output_tokens[user_key] += row["output_tokens"] or 0
        if (key_id := row.get("session__api_key_id")) is not None:
            self.key_requests[(key_id, row["status"])] += 1
            self.key_prompt_tokens[key_id] += row["prompt_tokens"] or 0
            self.key_output_tokens[key_id] += row["output_tokens"] or 0
        if row["started_at"] is not None:
            self._observe("queue", key, [max(0.0, (row["started_at"] - row["created_at"]).total_seconds())])
        stats = row["stats"] if isinstance(row["stats"], Mapping) else {}
        ttft_ms, e2e_ms = _number(stats.get("ttft_ms")), _number(stats.get("e2e_ms"))
        if ttft_ms is not None:
            self._observe("ttft", key, [ttft_ms / 1000])
            if e2e_ms is not None:
                self._observe("duration", key, [e2e_ms / 1000])
        gaps = stats.get("inter_token_gaps_ms")
        if isinstance(gaps, list):
            self._observe("itl", key, [g / 1000 for g in map(_number, gaps) if g is not None])
        drafts = draft_counts(stats)
        if drafts is not None:
            self.draft_tokens[key] += drafts[0]
            self.draft_accepted_tokens[key] += drafts[1]

    def merged(self, other: Totals) -> Totals:
        histograms = dict(self.histograms)
        for key, histogram in other.histograms.items():
            mine = histograms.get(key)
            histograms[key] = histogram if mine is None else mine.merged(histogram)
        return Totals(
            histograms,
            self.turns + other.turns,
            self.prompt_tokens + other.prompt_tokens,
            self.output_tokens + other.output_tokens,
            self.draft_tokens + other.draft_tokens,
            self.draft_accepted_tokens + other.draft_accepted_tokens,
            self.key_requests + other.key_requests,
            self.key_prompt_tokens + other.key_prompt_tokens,
            self.key_output_tokens + other.key_output_tokens,
        )


TURN_FIELDS = (
    "id", "status", "created_at", "started_at", "prompt_tokens", "output_tokens", "stats",
    "rig_id", "session__rig_id", "session__model_name", "session__owner_id", "session__api_key_id",
)  # fmt: skip


def _rows(where: Q) -> Iterable[dict[str, Any]]:
    rows: Iterable[dict[str, Any]] = (
        Turn.objects.filter(where).order_by("id").values(*TURN_FIELDS).iterator(chunk_size=FOLD_BATCH)
    )
    return rows


class TurnTotals:
    """This process's folded totals; ``snapshot()`` is what one scrape reports.

    1. Turns up to ``_through_id`` have been read once: the finished ones folded, the active ones kept as pending.
    2. Each scrape reads the turns above it that are older than SETTLE_S, in one statement, and moves the mark.
    3. Pending turns that have finished since are folded (a handful: the turns queued or running).
    4. Finished turns above the mark (the last SETTLE_S) are added for this scrape only.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folded = Totals()
        self._through_id = 0
        self._pending: set[int] = set()

    def _advance(self) -> None:
        settled = timezone.now() - timedelta(seconds=SETTLE_S)
        newest = Turn.objects.filter(id__gt=self._through_id, created_at__lt=settled).aggregate(Max("id"))["id__max"]
        if newest is None:
            return
        for row in _rows(Q(id__gt=self._through_id, id__lte=newest)):
            if row["status"] in FINISHED:
                self._folded.add(row)
            else:
                self._pending.add(row["id"])
        self._through_id = newest

    def snapshot(self) -> Totals:
        with self._lock:
            self._advance()
            if self._pending:
                for row in _rows(Q(id__in=sorted(self._pending), status__in=FINISHED)):
                    self._folded.add(row)
                    self._pending.discard(row["id"])
            recent = Totals()
            for row in _rows(Q(id__gt=self._through_id, status__in=FINISHED)):
                recent.add(row)
            return self._folded.merged(recent)


turn_totals = TurnTotals()
