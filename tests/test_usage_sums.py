"""The usage page's stored sums over rolled-up days (inference/turns/usage_sums.py): a second request reads no
rolled-up rows but the table's page and shows the same page; a deleted user, a renamed one and a day the rollup writes
are seen at once; one user's range never reads another's; the next day's ranges replace the old ones; the rollup
command stores everyone's usual ranges ahead of the first visit."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inference.models import ChatSession, Turn, UsageDay, UsageRangeSums, UsageRolledDay
from inference.turns import usage_report, usage_rollup, usage_sums

pytestmark = pytest.mark.django_db
USAGE_DAY = UsageDay._meta.db_table


def _generate() -> None:
    call_command("rigdash_generate", days=40, users=14, turns=300, rigs=1, sample_days=1, raw_hours=0.2,
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


def test_a_renamed_user_is_shown_by_the_new_name_from_the_stored_sums():
    _generate()
    first, _ = _page()
    top = max(first["figures"][1]["data"], key=lambda trace: sum(trace["y"]))["name"]
    assert top != usage_rollup.OTHERS
    User.objects.filter(username=top).update(username="renamed-top")  # no signal: names are read on every request
    context, reads = _page()
    assert reads == 1
    names = {trace["name"] for trace in context["figures"][1]["data"]}
    assert "renamed-top" in names and top not in names


def test_a_user_who_joins_the_top_ten_today_is_charted_with_their_closed_days_too():
    _generate()
    first, _ = _page()
    charted = {trace["name"] for trace in first["figures"][1]["data"]}
    assert len(charted) == usage_report.CHART_USERS + 1
    have_days = UsageDay.objects.values("user_id")
    newcomer = User.objects.exclude(username__in=charted).filter(pk__in=have_days)[0]
    session = ChatSession.objects.filter(owner=newcomer)[0]
    now = timezone.now()
    Turn.objects.create(session=session, user_text="a long one", status=Turn.Status.DONE, output_tokens=10**7,
                        started_at=now, finished_at=now)  # fmt: skip
    context, _ = _page()
    trace = next(t for t in context["figures"][1]["data"] if t["name"] == newcomer.username)
    assert sum(trace["y"]) == 10**7 + _reply_tokens(newcomer.pk)  # today's turn and their rolled-up days


def test_a_day_the_rollup_writes_is_counted_at_once():
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
    assert usage_rollup.rollup(day, day + timedelta(days=1)) == 1  # and deletes the stored ranges holding the day
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


def test_the_next_days_ranges_replace_the_old_ones_and_the_rollup_command_stores_the_usual_ones(monkeypatch):
    _generate()
    call_command("rigdash_usage_rollup", stdout=io.StringIO())
    stored = set(UsageRangeSums.objects.values_list("first_day", "scope"))
    assert stored == {(usage_report.first_day(days), "*") for days in (30, 366)}
    assert _page()[1] == 1  # the first visit reads only the table's page

    tomorrow = usage_rollup.today_utc() + timedelta(days=1)
    monkeypatch.setattr(usage_rollup, "today_utc", lambda: tomorrow)
    monkeypatch.setattr(usage_sums, "today_utc", lambda: tomorrow)
    monkeypatch.setattr(usage_report, "today_utc", lambda: tomorrow)
    _, reads = _page()
    assert reads >= 3
    assert set(UsageRangeSums.objects.values_list("last_day", flat=True)) == {tomorrow - usage_rollup.CLOSED_AFTER}
