"""The usage page and CSV from the daily rollup (inference/turns/usage_rollup.py): totals, charts (the top users by
name, the rest together), a paginated table, and a CSV streamed a month of rows at a time (constant memory in the
length of the history)."""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, replace
from datetime import date, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import QuerySet

from inference.models import UsageDay
from inference.turns import usage
from inference.turns.usage import UsageRow
from inference.turns.usage_rollup import (
    CLOSED_AFTER,
    OTHERS,
    ROW_FIELDS,
    as_rows,
    closed,
    fold,
    grouped,
    grouped_named,
    live_rows,
    today_utc,
    top_users,
)

PAGE_ROWS = 100
CHART_USERS = 10  # users named in the per-user charts; the rest are stacked as "other users"
CSV_CHUNK_DAYS = 31


def first_day(days: int) -> date:
    return today_utc() - timedelta(days=days - 1)


def _figures(
    rolled: QuerySet[UsageDay], live: list[UsageRow], *, days: list[date], per_user: bool
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The charts (per model; per user with the top CHART_USERS by name and the rest as one) and the totals."""
    rolled_by_model = grouped(rolled, "model")
    by_model = rolled_by_model + fold(live, by="model")
    totals = usage.usage_totals(by_model)
    figures = [
        usage.figure_by_day(by_model, metric=m, split="model", days=days) for m in ("output_tokens", "turns", "busy_s")
    ]
    if per_user:
        names = top_users(rolled, live, keep=CHART_USERS)
        shown = set(names.values())
        live_named = [row if row.user in shown else replace(row, user=OTHERS) for row in live]
        day_totals = fold(rolled_by_model, by="day")
        by_user = grouped_named(rolled, names, day_totals) + fold(live_named, by="user")
        figures.insert(1, usage.figure_by_day(by_user, metric="output_tokens", split="user", days=days))
        figures.append(usage.figure_by_day(by_user, metric="busy_s", split="user", days=days))
    return figures, totals


def _page(rolled: Any, live: list[UsageRow], page: int) -> tuple[list[UsageRow], int]:
    """One page of the table, newest day first (the live days, then the rolled-up ones), and the page count."""
    newest_first = sorted(live, key=lambda r: (-r.day.toordinal(), r.user, r.model))
    count = rolled.count() + len(newest_first)
    pages = max(1, math.ceil(count / PAGE_ROWS))
    start = (max(1, min(page, pages)) - 1) * PAGE_ROWS
    rows = newest_first[start : start + PAGE_ROWS]
    skip = max(0, start - len(newest_first))
    wanted = PAGE_ROWS - len(rows)
    if wanted:
        ordered = rolled.order_by("-day", "user__username", "model_name").values(*ROW_FIELDS)
        rows += list(as_rows(ordered[skip : skip + wanted]))
    return rows, pages


def page_context(*, days: int, user_id: int | None, page: int) -> dict[str, Any]:
    """What the usage page shows: totals and charts over the whole range, the table one page at a time."""
    lo = first_day(days)
    live = live_rows(lo, user_id=user_id)
    rolled = closed(lo, user_id=user_id)
    day_list = usage.day_range(days, today=today_utc())
    rows, pages = _page(rolled, live, page)
    figures, totals = _figures(rolled, live, days=day_list, per_user=user_id is None)
    return {
        "rows": rows,
        "totals": totals,
        "figures": figures,
        "page": max(1, min(page, pages)),
        "pages": pages,
    }


def csv_chunks(days: int, user_id: int | None) -> Iterator[Callable[[], str]]:
    """Callables, each returning the CSV text of the next CSV_CHUNK_DAYS of rows (the first one the header)."""
    lo = first_day(days)
    yield functools.partial(usage.usage_csv, [])
    rolled = closed(lo, user_id=user_id)
    by_sql = in_sql()
    names = {} if by_sql else dict(User.objects.values_list("pk", "username"))
    last_closed = today_utc() - CLOSED_AFTER
    for start in range(0, (last_closed - lo).days + 1, CSV_CHUNK_DAYS):
        a, b = lo + timedelta(days=start), min(last_closed, lo + timedelta(days=start + CSV_CHUNK_DAYS - 1))
        if by_sql:
            yield functools.partial(_csv_month_sql, a, b, user_id)
        else:
            yield functools.partial(_csv_month, rolled.filter(day__gte=a, day__lte=b), names)
    yield functools.partial(_live_csv, lo, user_id)


def in_sql() -> bool:
    """Whether the database writes the CSV's months itself (PostgreSQL); SQLite's are formatted here."""
    return connection.vendor == "postgresql"


def _sql_safe(column: str) -> str:
    """``usage.csv_safe`` in SQL: a name starting with a formula character gets a leading quote."""
    starts = ", ".join(f"chr({ord(c)})" for c in usage.FORMULA_START)
    return f"CASE WHEN left({column}, 1) IN ({starts}) THEN chr(39) || {column} ELSE {column} END"


def _sql_csv_field(column: str) -> str:
    """A text field as Python's csv writer writes it (QUOTE_MINIMAL): quoted, its quotes doubled, when it holds a
    comma, a quote or a line break."""
    special = " OR ".join(f"strpos({column}, chr({ord(c)})) > 0" for c in (",", '"', "\n", "\r"))
    return f"CASE WHEN {special} THEN '\"' || replace({column}, '\"', '\"\"') || '\"' ELSE {column} END"


def _csv_month_sql(a: date, b: date, user_id: int | None) -> str:
    """The days [a, b] of rolled-up rows, each line written by PostgreSQL: the same rows, order, quoting and formula
    quoting as ``_csv_month``, named by a join and sorted by code point (COLLATE "C", as Python compares strings).
    Each name is made safe once (the MATERIALIZED lists), not once a row, and Python handles one string a row, not
    seven values. Numbers are PostgreSQL's shortest exact text (``5``, not ``5.0``)."""
    mine = "AND user_id = %s" if user_id is not None else ""
    safe_user, safe_model = _sql_safe("username"), _sql_safe("model_name")
    sql = f"""
        WITH rows AS MATERIALIZED (
            SELECT day, user_id, model_name, turns, prompt_tokens, output_tokens, busy_s
            FROM {UsageDay._meta.db_table} WHERE day >= %s AND day <= %s {mine}
        ), users AS MATERIALIZED (
            SELECT id, {safe_user} AS name, {_sql_csv_field(safe_user)} AS field FROM {User._meta.db_table}
        ), models AS MATERIALIZED (
            SELECT model_name, {safe_model} AS name, {_sql_csv_field(safe_model)} AS field
            FROM (SELECT DISTINCT model_name FROM rows) AS distinct_models
        )
        SELECT concat_ws(',', to_char(r.day, 'YYYY-MM-DD'), u.field, m.field, r.turns, r.prompt_tokens,
                         r.output_tokens, r.busy_s)
        FROM rows r JOIN users u ON u.id = r.user_id JOIN models m ON m.model_name = r.model_name
        ORDER BY r.day, u.name COLLATE "C", m.name COLLATE "C"
    """  # noqa: S608 (the table names are the models'; the values are bound)
    with connection.cursor() as cursor:
        cursor.execute(sql, [a, b] if user_id is None else [a, b, user_id])
        return "".join(f"{line}\n" for (line,) in cursor.fetchall())


def _csv_month(rows: QuerySet[UsageDay], names: dict[int, str]) -> str:
    """A month of rolled-up rows in the order of inference.turns.usage (day, user, model), where the database is
    SQLite: read in the unique index's order (day, user id, model), named and sorted here. Each name and day
    is made safe and formatted once, not once a row."""
    values = rows.order_by("day", "user_id", "model_name").values_list(
        "day", "user_id", "model_name", "turns", "prompt_tokens", "output_tokens", "busy_s"
    )
    safe = {pk: usage.csv_safe(name) for pk, name in names.items()}
    models: dict[str, str] = {}
    days: dict[date, str] = {}
    named = [
        (days.get(day) or days.setdefault(day, day.isoformat()), safe.get(user_id) or str(user_id),
         models.get(model) or models.setdefault(model, usage.csv_safe(model)), *rest)
        for day, user_id, model, *rest in values
    ]  # fmt: skip
    named.sort(key=lambda row: (row[0], row[1], row[2]))
    return _csv_text(named)


def _csv_text(rows: Iterable[tuple[Any, ...]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _live_csv(lo: date, user_id: int | None) -> str:
    rows = live_rows(lo, user_id=user_id)
    return _csv_text(
        (r.day.isoformat(), usage.csv_safe(r.user), usage.csv_safe(r.model), *astuple(r)[3:]) for r in rows
    )


def next_chunk(chunks: Iterator[Callable[[], str]]) -> str | None:
    """The next piece of the CSV (its queries run here), or None at the end."""
    make = next(chunks, None)
    return None if make is None else make()
