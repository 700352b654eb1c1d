"""The usage CSV's stored months (inference/turns/usage_csv.py) on PostgreSQL: the same bytes as writing the month
again, read back while its users keep their names, written again after a rename or a deletion, untouched by a new
user, and dropped by the rollup when it writes into the month."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.models import UsageCsvMonth, UsageDay, UsageRolledDay
from inference.turns import usage_csv, usage_report, usage_rollup

pytestmark = pytest.mark.django_db


def _generate() -> None:
    # 75 days of history hold at least one whole closed calendar month, whatever today's date
    call_command("rigdash_generate", days=75, users=8, turns=300, rigs=1, sample_days=1, raw_hours=0.2,
                 long_chat=10, stdout=io.StringIO())  # fmt: skip


def _csv(days: int = 366) -> str:
    return "".join(make() for make in usage_csv.csv_chunks(usage_report.first_day(days), None))


def _uncached(monkeypatch: pytest.MonkeyPatch) -> str:
    with monkeypatch.context() as patch:
        written = lambda first: usage_csv._csv_month_sql(first, usage_csv._month_end(first), None)  # noqa: E731
        patch.setattr(usage_csv, "cached_month", written)
        return _csv()


def _fullest() -> UsageCsvMonth:
    """The stored month with the most rows (the months before the generated history are stored empty)."""
    return max(UsageCsvMonth.objects.all(), key=lambda month: len(month.body))


def _writes() -> int:
    """How many of this CSV's requests' queries write a stored month."""
    with CaptureQueriesContext(connection) as queries:
        _csv()
    return sum(f"INSERT INTO {UsageCsvMonth._meta.db_table}" in q["sql"].replace('"', "") for q in queries)


def test_a_stored_month_reads_back_the_bytes_written_fresh(monkeypatch):
    _generate()
    assert usage_csv.in_sql()
    fresh = _csv()
    stored = UsageCsvMonth.objects.count()
    assert stored >= 1
    assert _writes() == 0
    assert _csv() == fresh == _uncached(monkeypatch)
    assert fresh.count("\n") > 50
    month = _fullest()
    assert month.body and month.body in fresh
    days = {line.split(",")[0][:7] for line in month.body.splitlines()}
    assert days == {f"{month.month:%Y-%m}"}  # a whole calendar month, and only that month


def test_a_renamed_or_deleted_user_rewrites_the_months_they_are_in(monkeypatch):
    _generate()
    _csv()
    month = _fullest()
    last = usage_csv._month_end(month.month)
    in_it = UsageDay.objects.filter(day__gte=month.month, day__lte=last).values_list("user_id", flat=True)
    renamed = User.objects.get(pk=in_it[0])
    old = renamed.username
    User.objects.filter(pk=renamed.pk).update(username="=renamed")  # no signal: the check is on the names themselves
    text = _csv()
    assert f",{old}," not in text and ",'=renamed," in text
    assert text == _uncached(monkeypatch)
    assert _writes() == 0  # stored again, with the new name

    gone = User.objects.get(username="=renamed")
    gone.delete()  # its usage rows go with it (CASCADE)
    text = _csv()
    assert "=renamed" not in text
    assert text == _uncached(monkeypatch)


def test_a_new_user_does_not_rewrite_a_stored_month():
    _generate()
    _csv()
    User.objects.create_user("newcomer", password="x" * 12)
    assert _writes() == 0


def test_the_rollup_drops_the_months_it_writes_into(monkeypatch):
    _generate()
    _csv()
    month = _fullest()
    day = month.month.replace(day=3)
    UsageRolledDay.objects.filter(day=day).delete()  # as if that day had not been rolled up
    kept = list(UsageDay.objects.filter(day=day).values_list("pk", flat=True))
    UsageDay.objects.filter(pk__in=kept).delete()
    assert UsageCsvMonth.objects.filter(month=month.month).exists()
    assert usage_rollup.rollup(day, usage_rollup.today_utc()) == 1
    assert not UsageCsvMonth.objects.filter(month=month.month).exists()
    assert _csv() == _uncached(monkeypatch)


def test_the_rollup_command_stores_the_closed_months_ahead_of_the_first_download():
    _generate()
    out = io.StringIO()
    call_command("rigdash_usage_rollup", stdout=out)
    assert "closed months ready" in out.getvalue()
    assert UsageCsvMonth.objects.count() >= 1
    assert _writes() == 0
