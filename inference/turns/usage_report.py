"""The usage page from the daily rollup (inference/turns/usage_rollup.py): totals, charts (the top users by name, the
rest together), each API key's sums and a paginated table. The CSV is inference/turns/usage_csv.py."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import date, timedelta
from typing import Any

from django.db.models import F

from inference.turns import usage
from inference.turns.usage import UsageRow
from inference.turns.usage_keys import key_usage
from inference.turns.usage_rollup import (
    OTHERS,
    ROW_FIELDS,
    as_rows,
    closed,
    fold,
    grouped_named,
    live_rows,
    today_utc,
    top_users,
)
from inference.turns.usage_sums import ClosedSums, closed_sums, every_user, keep, range_key, with_named

PAGE_ROWS = 100
CHART_USERS = 10  # users named in the per-user charts; the rest are stacked as "other users"


def first_day(days: int) -> date:
    return today_utc() - timedelta(days=days - 1)


def _figures(
    sums: ClosedSums, live: list[UsageRow], *, days: list[date], names: dict[int, str] | None
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The charts (per model; over everyone, per user too: ``names``, the top CHART_USERS by id, by name and the rest
    as one) and the totals."""
    by_model = sums.by_model + fold(live, by="model")
    totals = usage.usage_totals(by_model)
    figures = usage.figures_by_day(by_model, metrics=["output_tokens", "turns", "busy_s"], split="model", days=days)
    if names is not None:
        shown = set(names.values())
        live_named = [row if row.user in shown else replace(row, user=OTHERS) for row in live]
        day_totals = fold(sums.by_model, by="day")
        by_user = grouped_named(names, sums.named, day_totals) + fold(live_named, by="user")
        tokens, busy = usage.figures_by_day(by_user, metrics=["output_tokens", "busy_s"], split="user", days=days)
        figures.insert(1, tokens)
        figures.append(busy)
    return figures, totals


def _page(rolled: Any, rolled_count: int, live: list[UsageRow], page: int) -> tuple[list[UsageRow], int]:
    """One page of the table, newest day first (the live days, then the rolled-up ones), and the page count."""
    newest_first = sorted(live, key=lambda r: (-r.day.toordinal(), r.user, r.model, r.api_key))
    count = rolled_count + len(newest_first)
    pages = max(1, math.ceil(count / PAGE_ROWS))
    start = (max(1, min(page, pages)) - 1) * PAGE_ROWS
    rows = newest_first[start : start + PAGE_ROWS]
    skip = max(0, start - len(newest_first))
    wanted = PAGE_ROWS - len(rows)
    if wanted:
        by_key = (F("api_key__name").asc(nulls_first=True), "api_key_id")  # no key first, as "" sorts in Python
        ordered = rolled.order_by("-day", "user__username", "model_name", *by_key).values(*ROW_FIELDS)
        rows += list(as_rows(ordered[skip : skip + wanted]))
    return rows, pages


def page_context(*, days: int, user_id: int | None, page: int) -> dict[str, Any]:
    """What the usage page shows: totals and charts over the whole range, the table one page at a time."""
    lo = first_day(days)
    live = live_rows(lo, user_id=user_id)
    rolled = closed(lo, user_id=user_id)
    day_list = usage.day_range(days, today=today_utc())
    users = every_user() if user_id is None else None
    sums = closed_sums(rolled, range_key(lo, user_id=user_id, user_ids=users or ()))
    names = None
    if users is not None:
        names = top_users(sums.reply_tokens, users, live, keep=CHART_USERS)
        sums = with_named(sums, rolled, names)
    keep(sums)
    rows, pages = _page(rolled, sums.rows, live, page)
    figures, totals = _figures(sums, live, days=day_list, names=names)
    return {
        "rows": rows,
        "totals": totals,
        "figures": figures,
        "by_key": key_usage(sums.by_key, live, user_id=user_id),
        "chat_pages": usage.CHAT_PAGES,
        "page": max(1, min(page, pages)),
        "pages": pages,
    }
