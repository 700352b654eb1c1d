"""Usage per UTC day, user, model and API key: turns, prompt and reply tokens, busy seconds on the rig.

The aggregation, the Plotly figures and the CSV are pure functions of plain records (tested without a
database); ``usage_records`` is the one database read. A turn counts on the day it started (or was
submitted, if it never started); its busy time is started -> finished.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.utils import timezone

from inference.models import Turn

MAX_DAYS = 366


@dataclass(frozen=True)
class TurnRecord:
    user: str
    model: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    prompt_tokens: int | None
    output_tokens: int | None
    api_key: str = ""  # key_label of the key it was made with, "" for none
    api_key_id: int | None = None


@dataclass
class UsageRow:
    day: date
    user: str
    model: str
    turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    busy_s: float = 0.0
    api_key: str = ""  # key_label of the key, "" for the chat pages (no key); the CSV's last column
    api_key_id: int | None = None  # not in the CSV: the label names it


CHAT_PAGES = "chat pages"  # what the page calls the requests made without an API key


def key_label(name: str | None, key_id: int | None) -> str:
    """An API key as the usage page and CSV name it: its name and id (names are not unique), "" for no key."""
    return "" if key_id is None else f"{name} #{key_id}"


def aggregate_usage(records: Iterable[TurnRecord]) -> list[UsageRow]:
    """One row per (UTC day, user, model, API key), sorted by day, user, model, key."""
    rows: dict[tuple[date, str, str, str], UsageRow] = {}
    for r in records:
        day = (r.started_at or r.created_at).astimezone(UTC).date()
        row = rows.setdefault(
            (day, r.user, r.model, r.api_key),
            UsageRow(day=day, user=r.user, model=r.model, api_key=r.api_key, api_key_id=r.api_key_id),
        )
        row.turns += 1
        row.prompt_tokens += r.prompt_tokens or 0
        row.output_tokens += r.output_tokens or 0
        if r.started_at and r.finished_at and r.finished_at > r.started_at:
            row.busy_s += (r.finished_at - r.started_at).total_seconds()
    for row in rows.values():
        row.busy_s = round(row.busy_s, 3)
    return [rows[key] for key in sorted(rows)]


METRICS = {
    "output_tokens": "Reply tokens",
    "prompt_tokens": "Prompt tokens",
    "turns": "Turns",
    "busy_s": "Busy seconds on the rig",
}


def figure_by_day(rows: Sequence[UsageRow], *, metric: str, split: str, days: Sequence[date]) -> dict[str, Any]:
    """A stacked bar chart of ``metric`` per day, one trace per ``split`` value (``user`` or ``model``)."""
    return figures_by_day(rows, metrics=[metric], split=split, days=days)[0]


def figures_by_day(
    rows: Sequence[UsageRow], *, metrics: Sequence[str], split: str, days: Sequence[date]
) -> list[dict[str, Any]]:
    """``figure_by_day`` for each of ``metrics``, from one pass over the rows."""
    if split not in ("user", "model") or not all(metric in METRICS for metric in metrics):
        raise ValueError(f"unknown metric in {metrics!r} or split {split!r}")
    labels = [d.isoformat() for d in days]
    index = {d: i for i, d in enumerate(days)}
    series: dict[str, list[list[float]]] = {}  # split value -> one list of per-day values per metric
    for row in rows:
        at = index.get(row.day)
        if at is None:
            continue
        name = row.user if split == "user" else row.model
        per_metric = series.get(name)
        if per_metric is None:
            per_metric = series[name] = [[0] * len(days) for _ in metrics]
        for values, metric in zip(per_metric, metrics, strict=True):
            values[at] += getattr(row, metric)
    return [
        {
            "data": [
                {
                    "type": "bar",
                    "name": name,
                    "x": labels,
                    "y": series[name][n],
                    "hovertemplate": f"{name}<br>%{{x}}: %{{y}}<extra></extra>",
                }
                for name in sorted(series)
            ],
            "layout": {
                "title": {"text": f"{METRICS[metric]} per day, by {split}"},
                "barmode": "stack",
                "xaxis": {"type": "category", "title": {"text": "day (UTC)"}},
                "yaxis": {"title": {"text": METRICS[metric]}, "rangemode": "tozero"},
                "margin": {"t": 40, "r": 10, "b": 60, "l": 60},
                "height": 300,
                "showlegend": True,
            },
        }
        for n, metric in enumerate(metrics)
    ]


def usage_totals(rows: Iterable[UsageRow]) -> dict[str, float]:
    rows = list(rows)
    return {name: round(sum(getattr(r, name) for r in rows), 3) for name in METRICS}


# A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection"): a name gets a leading quote.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(name: str) -> str:
    return f"'{name}" if name[:1] in FORMULA_START else name


# The CSV's columns: new ones go at the end, so a consumer reading columns by position keeps working.
CSV_FIELDS = ("day", "user", "model", "turns", "prompt_tokens", "output_tokens", "busy_s", "api_key")


def csv_values(row: UsageRow) -> tuple[Any, ...]:
    """A row's CSV fields (CSV_FIELDS), names made safe."""
    return (row.day.isoformat(), csv_safe(row.user), csv_safe(row.model), row.turns, row.prompt_tokens,
            row.output_tokens, row.busy_s, csv_safe(row.api_key))  # fmt: skip


def usage_csv(rows: Iterable[UsageRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    writer.writerows(csv_values(row) for row in rows)
    return out.getvalue()


def day_range(days: int, *, today: date) -> list[date]:
    return [today - timedelta(days=n) for n in range(days - 1, -1, -1)]


def usage_records(*, days: int, user_id: int | None) -> list[TurnRecord]:
    """Turns submitted in the last ``days`` UTC days, of one user or (None) everyone."""
    since = datetime.combine(timezone.now().astimezone(UTC).date() - timedelta(days=days - 1), datetime.min.time(), UTC)
    turns = Turn.objects.filter(created_at__gte=since)
    if user_id is not None:
        turns = turns.filter(session__owner_id=user_id)
    values = turns.values_list(
        "session__owner__username",
        "session__model_name",
        "created_at",
        "started_at",
        "finished_at",
        "prompt_tokens",
        "output_tokens",
        "session__api_key_id",
        "session__api_key__name",
    )
    return [
        TurnRecord(user, model, created, started, finished, prompt, output, key_label(key_name, key_id), key_id)
        for user, model, created, started, finished, prompt, output, key_id, key_name in values.iterator()
    ]
