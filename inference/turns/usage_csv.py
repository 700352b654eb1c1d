"""The usage CSV, streamed a calendar month of rows at a time (constant memory in the length of the history).

Closed days come from the daily rollup (inference/turns/usage_rollup.py), the last two days live from turns. On
PostgreSQL the database writes each line; a whole closed calendar month over every user is kept as that text
(``UsageCsvMonth``) and read back while the month's users still have the names it was written with: the rollup is
the one writer of a closed day's rows and drops the months it writes into, and a user renamed or deleted changes
the md5 of the month's "id:username" list. A key's name never changes (inference/board/apikeys.py has no rename) and
a key goes only with its owner, so the users' names cover the ``api_key`` column too. On SQLite (``scripts/run``'s
default) the months are formatted in Python each time. docs/admin.md ("Usage") describes the file.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Callable, Iterable, Iterator
from datetime import date, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import QuerySet

from inference.models import ApiKey, UsageCsvMonth, UsageDay
from inference.turns import usage
from inference.turns.usage_rollup import CLOSED_AFTER, closed, live_rows, today_utc


def csv_chunks(start: date, user_id: int | None) -> Iterator[Callable[[], str]]:
    """Callables, each returning the CSV text of the next calendar month of rows from ``start`` (the first one the
    header, the last one the live days)."""
    yield functools.partial(usage.usage_csv, [])
    rolled = closed(start, user_id=user_id)  # rolls up the closed days not rolled up yet
    by_sql = in_sql()
    names = {} if by_sql else dict(User.objects.values_list("pk", "username"))
    keys = {} if by_sql else {pk: usage.key_label(name, pk) for pk, name in ApiKey.objects.values_list("pk", "name")}
    for a, b in month_spans(start, today_utc() - CLOSED_AFTER):
        if not by_sql:
            yield functools.partial(_csv_month, rolled.filter(day__gte=a, day__lte=b), names, keys)
        elif user_id is None and a.day == 1 and b == _month_end(a):
            yield functools.partial(cached_month, a)
        else:
            yield functools.partial(_csv_month_sql, a, b, user_id)
    yield functools.partial(_live_csv, start, user_id)


def next_chunk(chunks: Iterator[Callable[[], str]]) -> str | None:
    """The next piece of the CSV (its queries run here), or None at the end."""
    make = next(chunks, None)
    return None if make is None else make()


def in_sql() -> bool:
    """Whether the database writes the CSV's months itself (PostgreSQL); SQLite's are formatted here."""
    return connection.vendor == "postgresql"


def month_spans(start: date, last: date) -> Iterator[tuple[date, date]]:
    """[start, last] cut at calendar months' ends: (first day, last day) of each piece."""
    a = start
    while a <= last:
        b = min(last, _month_end(a))
        yield a, b
        a = b + timedelta(days=1)


def warm_months(start: date, last: date) -> int:
    """Make sure every whole calendar month in [start, last] is stored; returns how many there are."""
    whole = [a for a, b in month_spans(start, last) if a.day == 1 and b == _month_end(a)]
    for first in whole:
        cached_month(first)
    return len(whole)


def _month_end(day: date) -> date:
    following = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
    return following - timedelta(days=1)


# The stored months' format, in their md5: a month stored in another format (before the api_key column) never matches.
CSV_FORMAT = "api_key"

_USERS_OF = f"""
    SELECT coalesce(string_agg(u.id::text, ',' ORDER BY u.id), '') AS ids,
           md5('{CSV_FORMAT};' || coalesce(string_agg(u.id::text || ':' || u.username, ',' ORDER BY u.id), '')) AS md5
    FROM {User._meta.db_table} u
"""  # noqa: S608 (the table name is the model's)


def cached_month(first: date) -> str:
    """A closed calendar month of every user's rows: the stored text while its users' names are unchanged, else
    written again (and stored) from the rollup."""
    table = UsageCsvMonth._meta.db_table
    with connection.cursor() as cursor:
        users_now = f"{_USERS_OF} WHERE u.id = ANY(string_to_array(c.user_ids, ',')::bigint[])"
        cursor.execute(
            f"SELECT c.body FROM {table} c WHERE c.month = %s AND c.names_md5 = (SELECT md5 FROM ({users_now}) AS now)",  # noqa: S608
            [first],
        )
        row = cursor.fetchone()
        if row is None:  # one statement, so the lines and the names they are checked against are one snapshot
            ctes, line, joined, order = _month_query(first, _month_end(first), None)
            cursor.execute(
                f"""WITH {ctes}, named AS ({_USERS_OF} WHERE u.id IN (SELECT user_id FROM rows))
                    INSERT INTO {table} (month, user_ids, names_md5, body)
                    SELECT %s, named.ids, named.md5,
                           coalesce((SELECT string_agg({line} || chr(10), '' ORDER BY {order}) {joined}), '')
                    FROM named
                    ON CONFLICT (month) DO UPDATE
                    SET user_ids = EXCLUDED.user_ids, names_md5 = EXCLUDED.names_md5, body = EXCLUDED.body
                    RETURNING body""",  # noqa: S608
                [first, _month_end(first), first],
            )
            row = cursor.fetchone()
        assert row is not None
        return str(row[0])


def _sql_safe(column: str) -> str:
    """``usage.csv_safe`` in SQL: a name starting with a formula character gets a leading quote."""
    starts = ", ".join(f"chr({ord(c)})" for c in usage.FORMULA_START)
    return f"CASE WHEN left({column}, 1) IN ({starts}) THEN chr(39) || {column} ELSE {column} END"


def _sql_csv_field(column: str) -> str:
    """A text field as Python's csv writer writes it (QUOTE_MINIMAL): quoted, its quotes doubled, when it holds a
    comma, a quote or a line break."""
    special = " OR ".join(f"strpos({column}, chr({ord(c)})) > 0" for c in (",", '"', "\n", "\r"))
    return f"CASE WHEN {special} THEN '\"' || replace({column}, '\"', '\"\"') || '\"' ELSE {column} END"


def _month_query(a: date, b: date, user_id: int | None) -> tuple[str, str, str, str]:
    """The days [a, b] of rolled-up rows as CSV lines written by PostgreSQL, in four pieces of SQL: the CTEs
    (``rows``, ``users``, ``models``, ``keys``; parameters a, b, then the user's id when given), a row's line, the
    FROM clause and the order. The rows, order, quoting and formula quoting are ``_csv_month``'s, named by a join
    and sorted by code point (COLLATE "C", as Python compares strings). Each name is made safe once (the
    MATERIALIZED lists), not once a row. Numbers are PostgreSQL's shortest exact text (``5``, not ``5.0``)."""
    mine = "AND user_id = %s" if user_id is not None else ""
    safe_user, safe_model, safe_key = _sql_safe("username"), _sql_safe("model_name"), _sql_safe("label")
    ctes = f"""
        rows AS MATERIALIZED (
            SELECT day, user_id, model_name, api_key_id, turns, prompt_tokens, output_tokens, busy_s
            FROM {UsageDay._meta.db_table} WHERE day >= %s AND day <= %s {mine}
        ), users AS MATERIALIZED (
            SELECT id, {safe_user} AS name, {_sql_csv_field(safe_user)} AS field FROM {User._meta.db_table}
        ), models AS MATERIALIZED (
            SELECT model_name, {safe_model} AS name, {_sql_csv_field(safe_model)} AS field
            FROM (SELECT DISTINCT model_name FROM rows) AS distinct_models
        ), keys AS MATERIALIZED (
            SELECT id, {safe_key} AS name, {_sql_csv_field(safe_key)} AS field
            FROM (SELECT id, name || ' #' || id::text AS label FROM {ApiKey._meta.db_table}
                  WHERE id IN (SELECT api_key_id FROM rows)) AS used_keys
        )"""  # noqa: S608 (the table names are the models'; the values are bound)
    line = (
        "concat_ws(',', to_char(r.day, 'YYYY-MM-DD'), u.field, m.field, r.turns, r.prompt_tokens, r.output_tokens,"
        " r.busy_s, coalesce(k.field, ''))"
    )
    joined = (
        "FROM rows r JOIN users u ON u.id = r.user_id JOIN models m ON m.model_name = r.model_name"
        " LEFT JOIN keys k ON k.id = r.api_key_id"
    )
    return ctes, line, joined, 'r.day, u.name COLLATE "C", m.name COLLATE "C", coalesce(k.name, \'\') COLLATE "C"'


def _csv_month_sql(a: date, b: date, user_id: int | None) -> str:
    """The days [a, b] of rolled-up rows, each line written by PostgreSQL (``_month_query``): Python handles one
    string a row, not seven values."""
    ctes, line, joined, order = _month_query(a, b, user_id)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {ctes} SELECT {line} {joined} ORDER BY {order}", [a, b] if user_id is None else [a, b, user_id]
        )
        return "".join(f"{text}\n" for (text,) in cursor.fetchall())


def _csv_month(rows: QuerySet[UsageDay], names: dict[int, str], keys: dict[int, str]) -> str:
    """A month of rolled-up rows in the order of inference.turns.usage (day, user, model, key), where the database is
    SQLite: read in the unique index's order (day, user id, model), named and sorted here. Each name and day
    is made safe and formatted once, not once a row. ``keys``: each key's ``usage.key_label``."""
    values = rows.order_by("day", "user_id", "model_name").values_list(
        "day", "user_id", "model_name", "turns", "prompt_tokens", "output_tokens", "busy_s", "api_key_id"
    )
    safe = {pk: usage.csv_safe(name) for pk, name in names.items()}
    safe_keys = {pk: usage.csv_safe(label) for pk, label in keys.items()}
    models: dict[str, str] = {}
    days: dict[date, str] = {}
    named = [
        (days.get(day) or days.setdefault(day, day.isoformat()), safe.get(user_id) or str(user_id),
         models.get(model) or models.setdefault(model, usage.csv_safe(model)), *rest,
         "" if key_id is None else safe_keys.get(key_id) or str(key_id))
        for day, user_id, model, *rest, key_id in values
    ]  # fmt: skip
    named.sort(key=lambda row: (row[0], row[1], row[2], row[7]))
    return _csv_text(named)


def _csv_text(rows: Iterable[tuple[Any, ...]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _live_csv(start: date, user_id: int | None) -> str:
    return _csv_text(usage.csv_values(r) for r in live_rows(start, user_id=user_id))
