"""Usage from a daily rollup: closed UTC days are added up once into UsageDay (per day, user, model and API key), the
last two days live from turns.

``inference.turns.usage`` defines what counts (a turn on the UTC day it started, or was submitted if it never started;
busy time started -> finished); this module gives the same rows without reading every turn of the range, so a
year of a team's usage costs a few queries on the rollup. A day is rolled up when it is read and at least
``CLOSED_AFTER`` old (a turn is long over by then), once; ``rigdash_usage_rollup`` does it ahead of time.

What the rollup changes: turns deleted after their day was rolled up still count, and a turn waiting in the queue
for more than a day before it starts counts on both its submit day and its start day.

A rolled-up day does not change, so the usage page's sums over a range's rolled-up days are stored once a day
(inference/turns/usage_sums.py); ``rollup`` deletes the stored ranges it writes into.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import BigIntegerField, Case, Count, DurationField, F, Q, QuerySet, Sum, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce, TruncDate
from django.utils import timezone

from inference.models import ChatSession, Turn, UsageCsvMonth, UsageDay, UsageRangeSums, UsageRolledDay
from inference.turns.usage import UsageRow, key_label

CLOSED_AFTER = timedelta(days=2)  # today and yesterday are read live
OTHERS = "other users"


def today_utc() -> date:
    return timezone.now().astimezone(UTC).date()


def _start(day: date) -> datetime:
    return datetime.combine(day, datetime.min.time(), UTC)


def _busy() -> Case:
    return Case(
        When(finished_at__gt=F("started_at"), then=F("finished_at") - F("started_at")), output_field=DurationField()
    )


def turn_totals(lo: date, hi: date) -> QuerySet[Turn, dict[str, Any]]:
    """Turns whose day is in [lo, hi), added up per (day, user, model, API key), in the database (the rollup's one
    read)."""
    turns = Turn.objects.filter(created_at__gte=_start(lo) - timedelta(days=1), created_at__lt=_start(hi))
    return (
        turns.annotate(day=TruncDate(Coalesce("started_at", "created_at"), tzinfo=UTC))
        .filter(day__gte=lo, day__lt=hi)
        .values("day", "session__owner_id", "session__owner__username", "session__model_name", "session__api_key_id")
        .annotate(n=Count("id"), prompt=Sum("prompt_tokens"), output=Sum("output_tokens"), busy=Sum(_busy()))
        .order_by()
    )


def rollup(lo: date, hi: date) -> int:
    """Roll up the days in [lo, hi) that are closed and not rolled up yet; returns how many were."""
    hi = min(hi, today_utc() - CLOSED_AFTER + timedelta(days=1))
    done = set(UsageRolledDay.objects.filter(day__gte=lo, day__lt=hi).values_list("day", flat=True))
    missing = [lo + timedelta(days=n) for n in range((hi - lo).days) if lo + timedelta(days=n) not in done]
    if not missing:
        return 0
    rows = turn_totals(missing[0], missing[-1] + timedelta(days=1)).filter(day__in=missing)  # type: ignore[misc]
    with transaction.atomic():
        UsageDay.objects.bulk_create(
            (UsageDay(day=r["day"], user_id=r["session__owner_id"], model_name=r["session__model_name"],
                      api_key_id=r["session__api_key_id"], turns=r["n"], prompt_tokens=r["prompt"] or 0,
                      output_tokens=r["output"] or 0,
                      busy_s=round(r["busy"].total_seconds(), 3) if r["busy"] else 0.0)
             for r in rows.iterator()),
            batch_size=2000, ignore_conflicts=True,  # a concurrent request rolled the same day up
        )  # fmt: skip
        UsageRolledDay.objects.bulk_create([UsageRolledDay(day=day) for day in missing], ignore_conflicts=True)
        # The CSV's stored months (inference/turns/usage_csv.py) that these days fall in are written again when read.
        UsageCsvMonth.objects.filter(month__in={day.replace(day=1) for day in missing}).delete()
        # So are the usage page's stored sums of the ranges they fall in (inference/turns/usage_sums.py), and of
        # ranges that end before the newest of them: the pages read ranges to the last closed day.
        UsageRangeSums.objects.filter(
            Q(first_day__lte=missing[-1], last_day__gte=missing[0]) | Q(last_day__lt=missing[-1])
        ).delete()
    return len(missing)


def live_rows(lo: date, *, user_id: int | None) -> list[UsageRow]:
    """The days from ``lo`` to today that are not closed yet, from the turns themselves: summed per session in the
    database without a join (a join to every session made the planner hash them all), then per user, model and API
    key here with the few sessions read by id."""
    start = max(lo, today_utc() - CLOSED_AFTER + timedelta(days=1))
    turns = Turn.objects.filter(created_at__gte=_start(start) - timedelta(days=1))
    if user_id is not None:
        turns = turns.filter(session__in=ChatSession.objects.filter(owner_id=user_id).values("pk"))
    per_session = list(
        turns.annotate(day=TruncDate(Coalesce("started_at", "created_at"), tzinfo=UTC))
        .values("day", "session_id")
        .annotate(n=Count("id"), prompt=Sum("prompt_tokens"), output=Sum("output_tokens"), busy=Sum(_busy()))
        .order_by()
    )
    ids: Any = list({r["session_id"] for r in per_session})
    if connection.vendor == "postgresql":  # one array parameter: bound client-side, an IN list of thousands of ids
        ids = RawSQL("SELECT unnest(%s::bigint[])", [ids])  # costs Python more than the query does
    sessions = {
        pk: (name, model, key_label(key_name, key_id), key_id)
        for pk, name, model, key_id, key_name in ChatSession.objects.filter(pk__in=ids)
        .order_by()  # not the sessions' default order: a sort the lookup does not need
        .values_list("pk", "owner__username", "model_name", "api_key_id", "api_key__name")
    }
    rows: dict[tuple[date, str, str, str], UsageRow] = {}
    for r in per_session:
        if r["day"] < start or r["session_id"] not in sessions:
            continue
        name, model, key, key_id = sessions[r["session_id"]]
        row = rows.setdefault(
            (r["day"], name, model, key),
            UsageRow(day=r["day"], user=name, model=model, api_key=key, api_key_id=key_id),
        )
        row.turns += r["n"]
        row.prompt_tokens += r["prompt"] or 0
        row.output_tokens += r["output"] or 0
        row.busy_s += r["busy"].total_seconds() if r["busy"] else 0.0
    for row in rows.values():
        row.busy_s = round(row.busy_s, 3)
    return [rows[key] for key in sorted(rows)]


def closed(lo: date, *, user_id: int | None) -> QuerySet[UsageDay]:
    """The rolled-up rows from ``lo`` to the last closed day (rolled up first where they are not yet)."""
    rollup(lo, today_utc())
    rows = UsageDay.objects.filter(day__gte=lo, day__lte=today_utc() - CLOSED_AFTER)
    return rows.filter(user_id=user_id) if user_id is not None else rows


def as_rows(values: Iterable[dict[str, Any]]) -> Iterator[UsageRow]:
    for v in values:
        yield UsageRow(
            day=v["day"],
            user=v["user__username"],
            model=v["model_name"],
            turns=v["turns"],
            prompt_tokens=v["prompt_tokens"],
            output_tokens=v["output_tokens"],
            busy_s=v["busy_s"],
            api_key=key_label(v["api_key__name"], v["api_key_id"]),
            api_key_id=v["api_key_id"],
        )


ROW_FIELDS = ("day", "user__username", "model_name", "turns", "prompt_tokens", "output_tokens", "busy_s",
              "api_key_id", "api_key__name")  # fmt: skip


def fold(rows: Iterable[UsageRow], *, by: str) -> list[UsageRow]:
    """Rows summed per (day, model), per (day, user) or per day (``by``: "model", "user", "day"), busy seconds
    rounded to the millisecond once summed."""
    sums: dict[tuple[date, str], list[Any]] = {}  # key -> [turns, prompt, output, busy]
    for row in rows:
        key = (row.day, row.model if by == "model" else row.user if by == "user" else "")
        if (total := sums.get(key)) is None:
            sums[key] = [row.turns, row.prompt_tokens, row.output_tokens, row.busy_s]
        else:
            total[0] += row.turns
            total[1] += row.prompt_tokens
            total[2] += row.output_tokens
            total[3] += row.busy_s
    return [
        UsageRow(day=day, user=name if by == "user" else "", model=name if by == "model" else "", turns=t,
                 prompt_tokens=p, output_tokens=o, busy_s=round(b, 3))
        for (day, name), (t, p, o, b) in sums.items()
    ]  # fmt: skip


def sums_per_day(rows: QuerySet[UsageDay], *keys: str) -> QuerySet[Any, tuple[Any, ...]]:
    """(day, *keys, turns, prompt, output, busy, rows) per (day, *keys). The token sums are cast back to bigint, so
    PostgreSQL's SUM (numeric for bigint) reaches Python as int, not Decimal."""
    sums: QuerySet[Any, tuple[Any, ...]] = (
        rows.values("day", *keys)
        .annotate(
            t=Sum("turns"),
            p=Cast(Sum("prompt_tokens"), BigIntegerField()),
            o=Cast(Sum("output_tokens"), BigIntegerField()),
            b=Sum("busy_s"),
            n=Count("*"),
        )
        .order_by()
        .values_list("day", *keys, "t", "p", "o", "b", "n")
    )
    return sums


def grouped_named(
    names: dict[int, str], per_id: Iterable[tuple[Any, ...]], day_totals: Iterable[UsageRow]
) -> list[UsageRow]:
    """Sums per (day, user) for the users in ``names``, by name, and per day for everyone else as "other users": the
    day's totals (``day_totals``, one row per day) less the named users'. ``per_id``: the named users' sums, (day,
    user id, turns, prompt, output, busy), read from their rows only (``usage_sums.with_named``), not every row."""
    named = [
        UsageRow(day=day, user=names[user_id], model="", turns=t, prompt_tokens=p, output_tokens=o, busy_s=round(b, 3))
        for day, user_id, t, p, o, b in per_id
    ]
    shown = {row.day: row for row in fold(named, by="day")}
    others = []
    for total in day_totals:
        seen = shown.get(total.day, UsageRow(day=total.day, user="", model=""))
        if total.turns > seen.turns:  # every rolled-up row has a turn: no more turns, no other users that day
            others.append(
                UsageRow(day=total.day, user=OTHERS, model="", turns=total.turns - seen.turns,
                         prompt_tokens=total.prompt_tokens - seen.prompt_tokens,
                         output_tokens=total.output_tokens - seen.output_tokens,
                         busy_s=max(0.0, round(total.busy_s - seen.busy_s, 3)))
            )  # fmt: skip
    return named + others


def top_users(
    reply_tokens: dict[int, int], users: dict[int, str], live: list[UsageRow], *, keep: int
) -> dict[int, str]:
    """The ``keep`` users (of ``users``: id -> name) with the most reply tokens in the range (``reply_tokens`` from
    the rolled-up days, by id, and the live rows, by name), by id."""
    totals = {pk: tokens for pk, tokens in reply_tokens.items() if pk in users}
    ids = {name: pk for pk, name in users.items()}
    for row in live:
        if row.user in ids:
            totals[ids[row.user]] = totals.get(ids[row.user], 0) + row.output_tokens
    top = sorted(totals, key=lambda pk: (-totals[pk], users[pk]))[:keep]
    return {pk: users[pk] for pk in top}
