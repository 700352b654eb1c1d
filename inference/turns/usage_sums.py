"""The usage page's sums over a range's rolled-up days, stored once a day (``UsageRangeSums``).

A rolled-up day does not change (inference/turns/usage_rollup.py), so what the page adds up over the closed days of a
range (per day and model, per API key, the row count, each user's reply tokens, and the ten named users' days) holds
until the next day closes. It is stored under the range's first and last closed day and whose range it is, so every web
process, and ``rigdash_usage_rollup`` ahead of the day's first visit, shares it. Everyone's range is read back only
while the users are the ones it summed (the md5 of every user's id: a deleted user's rows CASCADE away, a new user's
first day is not closed yet); names are read on every request, so a rename shows at once. The rollup deletes the ranges
it writes into, and those of earlier last days as each new day closes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

import orjson
from django.contrib.auth.models import User
from django.db.models import BigIntegerField, QuerySet, Sum
from django.db.models.functions import Cast

from inference.models import UsageDay, UsageRangeSums
from inference.turns.usage import UsageRow
from inference.turns.usage_rollup import CLOSED_AFTER, sums_per_day, today_utc

Named = tuple[date, int, int, int, int, float]  # day, user id, turns, prompt tokens, reply tokens, busy seconds
KeySums = tuple[int | None, int, int, int, float]  # API key id (None: no key), turns, prompt, reply tokens, busy s


@dataclass(frozen=True)
class RangeKey:
    first_day: date
    last_day: date  # the last closed day
    scope: str  # "*" for everyone, else the user's id
    user_ids_md5: str  # everyone's: the md5 of every user's id; "" for one user's range


@dataclass(frozen=True)
class ClosedSums:
    """A range's rolled-up rows added up for the usage page."""

    key: RangeKey
    by_model: list[UsageRow]  # per (day, model)
    by_key: list[KeySums]  # per API key over the whole range
    rows: int  # how many rolled-up rows (the table's row count)
    reply_tokens: dict[int, int]  # per user id (everyone's range; empty for one user's)
    named_ids: tuple[int, ...] = ()  # the users whose days ``named`` holds
    named: list[Named] = field(default_factory=list)
    stored: bool = False  # as read from its row: ``keep`` has nothing to write


def range_key(lo: date, *, user_id: int | None, user_ids: Iterable[int] = ()) -> RangeKey:
    """The key of the sums over the rolled-up days from ``lo``: of one user, or (None) of everyone, whose
    ``user_ids`` are every user's id."""
    last = today_utc() - CLOSED_AFTER
    if user_id is not None:
        return RangeKey(lo, last, str(user_id), "")
    ids = ",".join(map(str, sorted(user_ids))).encode()
    return RangeKey(lo, last, "*", hashlib.md5(ids).hexdigest())  # noqa: S324 (a fingerprint, not a secret)


def closed_sums(rows: QuerySet[UsageDay], key: RangeKey) -> ClosedSums:
    """Sums per (day, model), per API key, the row count and (everyone's range) each user's reply tokens: stored
    under ``key``, or two scans of ``rows`` (the range's rolled-up rows; ``keep`` stores them)."""
    if (stored := _read(key)) is not None:
        return stored
    per_model: dict[tuple[date, str], list[Any]] = {}
    per_key: dict[int | None, list[Any]] = {}
    count = 0
    for day, model, key_id, *sums, n in sums_per_day(rows, "model_name", "api_key_id"):
        for total in (per_model.setdefault((day, model), [0, 0, 0, 0.0]), per_key.setdefault(key_id, [0, 0, 0, 0.0])):
            for i, value in enumerate(sums):
                total[i] += value
        count += n
    by_model = [UsageRow(day=day, user="", model=model, turns=t, prompt_tokens=p, output_tokens=o, busy_s=round(b, 3))
                for (day, model), (t, p, o, b) in per_model.items()]  # fmt: skip
    by_key: list[KeySums] = [(key_id, t, p, o, round(b, 3)) for key_id, (t, p, o, b) in per_key.items()]
    reply_tokens: dict[int, int] = {}
    if key.scope == "*":
        per_user = rows.values("user_id").annotate(o=Cast(Sum("output_tokens"), BigIntegerField())).order_by()
        reply_tokens = dict(per_user.values_list("user_id", "o"))
    return ClosedSums(key=key, by_model=by_model, by_key=by_key, rows=count, reply_tokens=reply_tokens)


def with_named(sums: ClosedSums, rows: QuerySet[UsageDay], ids: Iterable[int]) -> ClosedSums:
    """``sums`` with the days of the users ``ids`` (per day and user): as stored when it holds these users, else read
    from their rows alone (the (user, day) index)."""
    wanted = tuple(sorted(ids))
    if sums.named_ids == wanted:
        return sums
    named: list[Named] = [row[:6] for row in sums_per_day(rows.filter(user_id__in=wanted), "user_id")] if wanted else []
    return replace(sums, named_ids=wanted, named=named, stored=False)


def keep(sums: ClosedSums) -> None:
    """Store ``sums`` unless they are what was read: one statement, which replaces the range's row if another request
    stored it meanwhile (or with other users' sums in it, or other named users)."""
    if sums.stored:
        return
    body = orjson.dumps(
        {
            "by_model": [
                (r.day.toordinal(), r.model, r.turns, r.prompt_tokens, r.output_tokens, r.busy_s) for r in sums.by_model
            ],
            "by_key": sums.by_key,
            "rows": sums.rows,
            "reply_tokens": list(sums.reply_tokens.items()),
            "named_ids": sums.named_ids,
            "named": [(d.toordinal(), pk, t, p, o, b) for d, pk, t, p, o, b in sums.named],
        }
    ).decode()
    key = sums.key
    UsageRangeSums.objects.bulk_create(
        [UsageRangeSums(first_day=key.first_day, last_day=key.last_day, scope=key.scope,
                        user_ids_md5=key.user_ids_md5, body=body)],
        update_conflicts=True,
        unique_fields=["first_day", "last_day", "scope"],
        update_fields=["user_ids_md5", "body"],
    )  # fmt: skip


def every_user() -> dict[int, str]:
    """Every user's name by id (the per-user charts' names and everyone's range's key)."""
    return dict(User.objects.values_list("pk", "username"))


def _read(key: RangeKey) -> ClosedSums | None:
    body = (
        UsageRangeSums.objects.filter(
            first_day=key.first_day, last_day=key.last_day, scope=key.scope, user_ids_md5=key.user_ids_md5
        )
        .values_list("body", flat=True)
        .first()
    )
    if body is None:
        return None
    data: dict[str, Any] = orjson.loads(body)
    if "by_key" not in data:  # stored before the sums had API keys: added up again
        return None
    return ClosedSums(
        key=key,
        by_model=[
            UsageRow(day=date.fromordinal(d), user="", model=m, turns=t, prompt_tokens=p, output_tokens=o, busy_s=b)
            for d, m, t, p, o, b in data["by_model"]
        ],
        by_key=[(key_id, t, p, o, b) for key_id, t, p, o, b in data["by_key"]],
        rows=data["rows"],
        reply_tokens={int(pk): tokens for pk, tokens in data["reply_tokens"]},
        named_ids=tuple(data["named_ids"]),
        named=[(date.fromordinal(d), pk, t, p, o, b) for d, pk, t, p, o, b in data["named"]],
        stored=True,
    )
