"""Cost as the data grows: the data generator, query counts per page pinned at two data sizes (an N+1 fails here),
the usage rollup against the per-turn aggregation it replaces, the streamed CSV, and thinned rig series."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count
from django.http import StreamingHttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inference.models import ChatSession, Rig, Turn, UsageDay, UsageRangeSums
from inference.turns import usage, usage_csv, usage_report, usage_rollup, usage_sums
from monitoring import selectors
from monitoring.models import RigSample

BUSY = usage.CSV_FIELDS.index("busy_s")  # PostgreSQL writes 5, Python 5.0
SMALL = {"users": 8, "turns": 150, "rigs": 2}
LARGE = {"users": 20, "turns": 900, "rigs": 5}  # six times the turns, more users and rigs

# The most queries each page may make, whatever the data: session and user (2), then the page's own.
PAGES = {
    "chat list": ("/", False, 4),
    "chat page": ("/sessions/{session}/", False, 6),  # with its settings, presets and versions (docs/chat.md)
    "chat turns API": ("/api/sessions/{session}/turns", False, 4),
    # The usage pages with their sums not stored yet: the read that misses, then the write (BEGIN, INSERT, COMMIT).
    "usage 30 d": ("/usage/?days=30", True, 14),
    "usage 366 d": ("/usage/?days=366", True, 14),
    "usage 366 d, one user": ("/usage/?days=366", False, 10),
    "usage page 2": ("/usage/?days=366&page=2", True, 15),
    "rig dashboard 1 h": ("/monitoring/rigs/{rig}/?range=1h", False, 8),
    "rig dashboard 24 h": ("/monitoring/rigs/{rig}/?range=24h", False, 8),
    "rig dashboard 30 d": ("/monitoring/rigs/{rig}/?range=30d", False, 8),
    "rig series 30 d": ("/monitoring/api/rigs/{rig}/series?range=30d", False, 5),
    "overview": ("/monitoring/", False, 5),
    "metrics": ("/metrics", True, 9),
    "audit log": ("/board/audit/", True, 3),
}


def generate(**size: int) -> None:
    call_command("rigdash_generate", days=40, sample_days=2, raw_hours=1.2, long_chat=30, stdout=io.StringIO(),
                 **{key: value for key, value in size.items()})  # fmt: skip


def _content(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else bytes(response.content)


def _clients() -> tuple[Client, Client]:
    heavy, admin = Client(), Client()
    heavy.force_login(User.objects.get(username="gen-user-000"))
    admin.force_login(User.objects.get(username="gen-user-001"))
    return heavy, admin


def _subjects() -> dict[str, int]:
    heavy = User.objects.get(username="gen-user-000")
    session = ChatSession.objects.filter(owner=heavy).annotate(n=Count("turns")).order_by("-n").first()
    rig = Rig.objects.filter(name__startswith="gen-rig-").order_by("pk").first()
    assert session is not None and rig is not None
    return {"session": session.pk, "rig": rig.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["small", "large"])
def test_each_page_makes_a_fixed_number_of_queries_whatever_the_data(size, django_assert_max_num_queries):
    generate(**size)
    heavy, admin = _clients()
    subjects = _subjects()
    for name, (url, staff, most) in PAGES.items():
        client = admin if staff else heavy
        _content(client.get(url.format(**subjects)))  # the first usage request rolls closed days up (once)
        UsageRangeSums.objects.all().delete()  # the usage pages' stored sums: pin the queries that write them
        with django_assert_max_num_queries(most, info=name):
            response = client.get(url.format(**subjects))
            assert response.status_code == 200, name
            _content(response)
    # The board asks the fair queue for each rig with waiting turns (inference/board.py): its turns, and when several
    # people wait, when each was last served. Per rig, never per turn of history.
    waiting_rigs = Turn.objects.filter(status="queued").order_by().values("session__rig").distinct().count()
    with django_assert_max_num_queries(5 + 2 * waiting_rigs, info="board turns API"):
        assert admin.get("/board/api/turns").status_code == 200


@pytest.mark.django_db
def test_the_csv_streams_a_month_at_a_time_in_a_fixed_number_of_queries(django_assert_max_num_queries):
    generate(**SMALL)
    _, admin = _clients()
    b"".join(admin.get("/usage.csv?days=366").streaming_content)  # rolls up and stores the closed months
    # session, user, the rollup's check, a query per calendar month of the range (at most 13), the live days (two)
    with django_assert_max_num_queries(2 + 1 + 13 + 2):
        response = admin.get("/usage.csv?days=366")
        assert isinstance(response, StreamingHttpResponse)
        text = b"".join(response.streaming_content).decode()
    assert text.startswith("day,user,model,turns,prompt_tokens,output_tokens,busy_s,api_key\n")


@pytest.mark.django_db
def test_the_rollup_and_live_days_add_up_to_what_every_turn_does():
    generate(**SMALL)
    every_turn = usage.aggregate_usage(usage.usage_records(days=366, user_id=None))
    assert usage_rollup.rollup(usage_report.first_day(366), usage_rollup.today_utc()) > 300
    assert UsageDay.objects.exists()
    streamed = list(
        csv.reader(io.StringIO(b"".join(_clients()[1].get("/usage.csv?days=366").streaming_content).decode()))
    )
    expected = list(csv.reader(io.StringIO(usage.usage_csv(every_turn))))
    # Busy seconds: the database adds up exact intervals, inference.turns.usage floats (a last digit may differ).
    assert [row[:BUSY] + row[BUSY + 1 :] for row in streamed] == [row[:BUSY] + row[BUSY + 1 :] for row in expected]
    assert all(abs(float(a[BUSY]) - float(b[BUSY])) <= 0.0011 for a, b in zip(streamed[1:], expected[1:], strict=True))
    context = usage_report.page_context(days=366, user_id=None, page=1)
    assert context["totals"] == pytest.approx(usage.usage_totals(every_turn), abs=0.01)
    assert context["pages"] == -(-len(every_turn) // usage_report.PAGE_ROWS)
    newest = sorted(every_turn, key=lambda r: (-r.day.toordinal(), r.user, r.model))[: usage_report.PAGE_ROWS]
    assert [(r.day, r.user, r.model, r.turns, r.output_tokens) for r in context["rows"]] == [
        (r.day, r.user, r.model, r.turns, r.output_tokens) for r in newest
    ]
    one = User.objects.get(username="gen-user-002").pk
    mine = usage.aggregate_usage(usage.usage_records(days=366, user_id=one))
    assert usage_report.page_context(days=366, user_id=one, page=1)["totals"] == pytest.approx(
        usage.usage_totals(mine), abs=0.01
    )


@pytest.mark.django_db
def test_per_user_charts_name_the_top_users_and_stack_the_rest():
    generate(**LARGE)
    figures = usage_report.page_context(days=366, user_id=None, page=1)["figures"]
    by_user = figures[1]
    names = [trace["name"] for trace in by_user["data"]]
    assert len(names) == usage_report.CHART_USERS + 1 and usage_rollup.OTHERS in names
    everyone = sum(sum(trace["y"]) for trace in by_user["data"])
    assert everyone == sum(sum(trace["y"]) for trace in figures[0]["data"])  # the same tokens, split two ways


@pytest.mark.django_db
def test_a_long_range_is_thinned_over_its_whole_span(monkeypatch):
    generate(**SMALL)
    rig = Rig.objects.get(pk=_subjects()["rig"])
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)
    for range_s in (3600, 2 * 86400):
        with CaptureQueriesContext(connection) as queries:
            columns = selectors.rig_series(rig, range_s)
        # the buckets are named in SQL, not as a list of 1,500 times for the client to bind
        assert max(len(q["sql"]) for q in queries) < 3000
        assert 0 < len(columns["ts"]) <= selectors.MAX_POINTS
        span = columns["ts"][-1] - columns["ts"][0]
        assert span > range_s * 0.9, "the chart covers the range, not only its newest part"
        buckets = [int(ts // columns["step_s"]) for ts in columns["ts"]]
        assert len(set(buckets)) == len(buckets), "one sample per bucket"
    for range_s in (3600, 6 * 3600, 2 * 86400):  # 6 h: buckets of 15 s, several samples each
        columns = selectors.rig_series(rig, range_s)
        with monkeypatch.context() as other:  # the list, as on a database other than PostgreSQL: the same points
            other.setattr(selectors, "connection", SimpleNamespace(vendor="sqlite"))
            assert selectors.rig_series(rig, range_s) == columns
    latest = selectors.rigs_latest(Rig.objects.all())
    newest = RigSample.objects.filter(rig=rig, resolution_s=RigSample.RAW_S).order_by("-ts").first()
    assert newest is not None and latest[rig.pk]["ts"] == newest.ts.timestamp()


@pytest.mark.django_db
def test_the_generator_makes_a_realistic_small_history_and_refuses_a_database_with_people(owner):
    with pytest.raises(CommandError, match="users this command did not make"):
        generate(**SMALL)
    assert not Turn.objects.exists() and not User.objects.filter(username__startswith="gen-").exists()
    generate(force=True, **SMALL)
    turns = Turn.objects.filter(session__owner__username__startswith="gen-")
    assert turns.count() == SMALL["turns"] + 16  # the history (the long chat among them) and the turns running now
    done = turns.filter(status="done").first()
    assert done is not None
    stats: dict[str, Any] = done.stats
    assert len(stats["inter_token_gaps_ms"]) == stats["output_tokens"] - 1 == done.output_tokens - 1
    assert {"ttft_ms", "decode_tps", "e2e_ms", "prompt_tokens", "backend_timings", "context_limit"} <= set(stats)
    assert done.started_at < done.finished_at <= timezone.now()
    raw = RigSample.objects.filter(resolution_s=RigSample.RAW_S)
    assert raw.exists() and all(s.detail.get("slots") for s in raw[:5])
    oldest = RigSample.objects.filter(resolution_s=RigSample.DOWNSAMPLED_S).order_by("ts").first()
    assert oldest is not None and timezone.now() - oldest.ts <= timedelta(days=2, minutes=5)
    assert not RigSample.objects.filter(resolution_s=RigSample.RAW_S, ts__lt=timezone.now() - timedelta(hours=1.3))


@pytest.mark.django_db
def test_the_audit_log_pages_back_through_every_entry_once(admin_user, django_assert_max_num_queries):
    from inference.audit import audit_record
    from inference.board.audit_pages import PAGE_ROWS

    for n in range(2 * PAGE_ROWS + 50):
        audit_record(actor=admin_user, action="turn.cancel" if n % 3 else "user.create", target=f"turn:{n}")
    client = Client()
    client.force_login(admin_user)
    seen: list[int] = []
    url = "/board/audit/"
    while url:
        with django_assert_max_num_queries(3 + 1):  # session, user, the before-entry, the page
            page = client.get(url)
        assert page.status_code == 200
        seen += [entry.pk for entry in page.context["entries"]]
        older = page.context["older"]
        url = f"/board/audit/?before={older}" if older else ""
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 2 * PAGE_ROWS + 50
    filtered = client.get("/board/audit/?action=user.")
    assert {e.action for e in filtered.context["entries"]} == {"user.create"} and filtered.context["older"] is None


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_csv_streams_through_an_async_iterator():
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    await sync_to_async(generate)(**SMALL)
    client = AsyncClient()
    await client.aforce_login(await User.objects.aget(username="gen-user-001"))
    response = await client.get("/usage.csv?days=366")
    assert response.streaming and response.is_async  # Django would read a sync iterator whole before sending it
    chunks = [chunk async for chunk in response.streaming_content]
    assert len(chunks) >= 13  # the header, a chunk per month, the live days
    text = b"".join(chunks).decode()
    assert text.startswith(",".join(usage.CSV_FIELDS) + "\n") and text.count("\n") > 20


def _csv_rows(text: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text.decode())))


def _csv(days: int, user_id: int | None) -> bytes:
    return "".join(make() for make in usage_csv.csv_chunks(usage_report.first_day(days), user_id)).encode()


@pytest.mark.django_db
def test_the_months_postgresql_writes_are_the_ones_python_formats(monkeypatch):
    """On PostgreSQL the CSV's rolled-up months are written by the database; on SQLite, formatted in Python. Both give
    the same rows in the same order (names by code point, which a locale's collation would not), with the same CSV
    and formula quoting, for everyone and for one user."""
    generate(**SMALL)
    for old, new in (("gen-user-000", "=HYPERLINK(1)"), ("gen-user-004", "Zoë"), ("gen-user-005", "alice"),
                     ("gen-user-006", "@admin"), ("gen-user-007", "Bob")):  # fmt: skip
        User.objects.filter(username=old).update(username=new)
    usage_rollup.closed(usage_report.first_day(366), user_id=None)  # roll the days up, then rename some models
    with connection.cursor() as cursor:  # a linguistic collation, as a database made with en_US.UTF-8 has
        cursor.execute('ALTER TABLE auth_user ALTER COLUMN username TYPE varchar(150) COLLATE "und-x-icu"')
    days = sorted(set(UsageDay.objects.values_list("day", flat=True)))
    UsageDay.objects.filter(day=days[0]).update(model_name="\tcmd")
    UsageDay.objects.filter(day=days[1]).update(model_name="+1 model, with a comma")
    UsageDay.objects.filter(day=days[2]).update(model_name='a "quoted"\nmodel\r')
    assert usage_csv.in_sql()
    one = User.objects.get(username="=HYPERLINK(1)").pk
    copied = {None: _csv_rows(_csv(366, None)), one: _csv_rows(_csv(366, one))}
    monkeypatch.setattr(usage_csv, "in_sql", lambda: False)
    for user_id, rows in copied.items():
        formatted = _csv_rows(_csv(366, user_id))
        assert len(rows) == len(formatted) > 2
        assert [row[:BUSY] + row[BUSY + 1 :] for row in rows] == [row[:BUSY] + row[BUSY + 1 :] for row in formatted]
        assert all(float(a[BUSY]) == float(b[BUSY]) for a, b in zip(rows[1:], formatted[1:], strict=True))
    names = [row[1] for row in copied[None][1:]]
    assert {"'=HYPERLINK(1)", "'@admin", "Zoë", "alice", "Bob"} <= set(names)
    assert "=HYPERLINK(1)" not in names
    assert {row[2] for row in copied[None][1:]} >= {"'\tcmd", "'+1 model, with a comma", 'a "quoted"\nmodel\r'}
    first_day = [row[1] for row in copied[None][1:] if row[0] == copied[None][1][0]]
    assert first_day == sorted(first_day)  # code point order: "Bob" before "alice", "Zoë" before "alice"
    assert {row[1] for row in copied[one][1:]} == {"'=HYPERLINK(1)"}


@pytest.mark.django_db
def test_the_named_users_and_the_rest_add_up_to_every_rolled_up_row():
    """grouped_named reads only the named users' rows and takes "other users" as each day's total less theirs: the
    same sums as adding every rolled-up row up by hand."""
    generate(**LARGE)
    lo = usage_report.first_day(366)
    rolled = usage_rollup.closed(lo, user_id=None)
    users = usage_sums.every_user()
    closed = usage_sums.closed_sums(rolled, usage_sums.range_key(lo, user_id=None, user_ids=users))
    names = usage_rollup.top_users(closed.reply_tokens, users, [], keep=usage_report.CHART_USERS)
    assert 0 < len(names) < User.objects.count()
    expected: dict[tuple[Any, str], list[float]] = {}
    for row in rolled:
        sums = expected.setdefault((row.day, names.get(row.user_id, usage_rollup.OTHERS)), [0, 0, 0, 0.0])
        for i, value in enumerate((row.turns, row.prompt_tokens, row.output_tokens, row.busy_s)):
            sums[i] += value
    day_totals = usage_rollup.fold(closed.by_model, by="day")
    got = usage_rollup.grouped_named(names, usage_sums.with_named(closed, rolled, names).named, day_totals)
    assert len(got) == len(expected) == len({(r.day, r.user) for r in got})
    assert any(r.user == usage_rollup.OTHERS for r in got) and any(r.user in names.values() for r in got)
    for r in got:
        turns, prompt, output, busy = expected[(r.day, r.user)]
        assert (r.turns, r.prompt_tokens, r.output_tokens) == (turns, prompt, output)
        assert r.busy_s == pytest.approx(busy, abs=0.002)
