"""The usage page's sums over rolled-up days, kept in Django's cache (inference/turns/usage_rollup.py): a second
request reads no rolled-up rows and shows the same page; a deleted user, a renamed one and a day the rollup writes
are seen at once; one user's range never reads another's."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.models import Turn, UsageDay, UsageRolledDay
from inference.turns import usage_report, usage_rollup

pytestmark = pytest.mark.django_db
USAGE_DAY = UsageDay._meta.db_table


def _generate() -> None:
    call_command("rigdash_generate", days=40, users=8, turns=300, rigs=1, sample_days=1, raw_hours=0.2,
                 long_chat=10, stdout=io.StringIO())  # fmt: skip


def _page(user_id: int | None = None) -> tuple[dict[str, Any], int]:
    """The page's context over 366 days, and how many of its queries read the rolled-up rows."""
    with CaptureQueriesContext(connection) as queries:
        context = usage_report.page_context(days=366, user_id=user_id, page=1)
    return context, sum(f'FROM "{USAGE_DAY}"' in q["sql"] for q in queries)


def _shown(context: dict[str, Any]) -> tuple[Any, ...]:
    return context["totals"], context["figures"], [vars(row) for row in context["rows"]], context["pages"]


def test_a_second_request_reads_only_the_table_page_and_shows_the_same():
    _generate()
    first, reads = _page()
    assert reads >= 3  # the sums per (day, model), per user, the named users' days; and the table's page
    second, reads = _page()
    assert reads == 1  # the table's page of rows
    assert _shown(second) == _shown(first)
    assert first["totals"]["turns"] > 0


def test_a_deleted_user_leaves_the_sums_at_once():
    _generate()
    before, _ = _page()
    heaviest = max(UsageDay.objects.values_list("user_id", flat=True).distinct(), key=_reply_tokens)
    lost = _reply_tokens(heaviest) + _live_tokens(before, heaviest)
    assert lost > 0
    User.objects.filter(pk=heaviest).delete()  # its rolled-up rows go with it (CASCADE)
    after, reads = _page()
    assert reads >= 3, "read afresh"
    assert after["totals"]["output_tokens"] == before["totals"]["output_tokens"] - lost


def test_a_renamed_user_is_shown_by_the_new_name_from_the_cached_sums():
    _generate()
    _page()
    top = usage_rollup.top_users(
        usage_rollup.closed_sums(
            usage_rollup.closed(usage_report.first_day(366), user_id=None),
            key=_everyone_key(),
            per_user=True,
        ).reply_tokens,
        dict(User.objects.values_list("pk", "username")),
        [],
        keep=1,
    )
    ((pk, old),) = top.items()
    User.objects.filter(pk=pk).update(username="renamed-top")  # no signal: names are read on every request
    context, _ = _page()
    names = {trace["name"] for trace in context["figures"][1]["data"]}
    assert "renamed-top" in names and old not in names


def test_a_day_the_rollup_writes_is_counted_at_once(django_capture_on_commit_callbacks):
    _generate()
    _page()  # rolls the closed days up
    day = UsageDay.objects.order_by("-day").values_list("day", flat=True).first()
    assert day is not None
    start = datetime.combine(day, datetime.min.time(), UTC)
    turn = Turn.objects.filter(started_at__gte=start, started_at__lt=start + timedelta(days=1), output_tokens__gt=0)[0]
    turn.delete()  # after its day was rolled up: it still counts there
    before, _ = _page()
    UsageRolledDay.objects.filter(day=day).delete()  # as if that day had never been rolled up
    UsageDay.objects.filter(day=day).delete()
    with django_capture_on_commit_callbacks(execute=True):  # the rollup moves the cache on when it commits
        assert usage_rollup.rollup(day, day + timedelta(days=1)) == 1
    after, reads = _page()
    assert reads >= 3
    assert after["totals"]["turns"] == before["totals"]["turns"] - 1
    assert after["totals"]["output_tokens"] == before["totals"]["output_tokens"] - turn.output_tokens


def test_one_users_range_is_kept_apart_from_everyones_and_from_another_users():
    _generate()
    everyone, _ = _page()
    users = list(UsageDay.objects.values_list("user_id", flat=True).distinct().order_by("user_id")[:2])
    one, _ = _page(users[0])
    other, _ = _page(users[1])
    assert one["totals"]["output_tokens"] == _reply_tokens(users[0]) + _live_tokens(one, users[0])
    assert other["totals"]["output_tokens"] == _reply_tokens(users[1]) + _live_tokens(other, users[1])
    assert one["totals"] != other["totals"] != everyone["totals"]
    assert _page(users[0])[0]["totals"] == one["totals"]


def _reply_tokens(user_id: int) -> int:
    return sum(UsageDay.objects.filter(user_id=user_id).values_list("output_tokens", flat=True))


def _live_tokens(context: dict[str, Any], user_id: int) -> int:
    """Reply tokens of the user's days that are not rolled up yet (today and yesterday), from the page's table."""
    name = User.objects.get(pk=user_id).username
    closed = usage_rollup.today_utc() - usage_rollup.CLOSED_AFTER
    return sum(row.output_tokens for row in context["rows"] if row.user == name and row.day > closed)


def _everyone_key() -> str:
    users = User.objects.values_list("pk", flat=True)
    return usage_rollup.closed_key(usage_report.first_day(366), user_id=None, user_ids=users)
