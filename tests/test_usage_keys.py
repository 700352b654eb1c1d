"""Usage per API key (docs/admin.md, "Usage"): the usage page's keys table and the CSV's ``api_key`` column give the
same figures for rolled-up days as for live ones, and as adding every turn up does; a user sees only their own keys,
staff everyone's; a revoked key still shows; key names are escaped on the page and made safe in the CSV; sums and
months stored before keys were counted are not served; the migration moves each key's share of old rows into rows
of its own."""

from __future__ import annotations

import csv
import importlib
import io
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from django.apps import apps
from django.db import connection
from django.test import Client

from inference.board.apikeys import api_key_create, api_key_revoke
from inference.models import ApiKey, ChatSession, Rig, Turn, UsageCsvMonth, UsageDay, UsageRangeSums
from inference.turns import usage, usage_csv, usage_report, usage_rollup

pytestmark = pytest.mark.django_db
EVIL = "=cmd|' /C calc'!A0"
SCRIPT = "<script>alert(1)</script>"
OTHER = 'other\'s tool, "quoted"'
CLOSED = 5  # days ago: a rolled-up day (usage_rollup.CLOSED_AFTER)
OLD = 60  # days ago: in a whole closed calendar month, which the CSV stores


@pytest.fixture
def usage_rig(db: Any) -> Rig:
    """A rig no worker serves: these turns are written as finished, nothing runs."""
    return Rig.objects.create(name="usage-rig", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9",
                              queue="rig.nobody-listens.usage")  # fmt: skip


def _turn(session: ChatSession, *, days_ago: int, prompt: int, output: int, busy_s: float) -> None:
    at = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=days_ago)
    if days_ago == 0:
        at = min(at, datetime.now(UTC) - timedelta(minutes=1))
    turn = Turn.objects.create(session=session, user_text="q", status=Turn.Status.DONE, started_at=at,
                               finished_at=at + timedelta(seconds=busy_s), prompt_tokens=prompt,
                               output_tokens=output)  # fmt: skip
    Turn.objects.filter(pk=turn.pk).update(created_at=at)


@pytest.fixture
def keyed(owner: Any, other_user: Any, usage_rig: Rig) -> dict[str, ApiKey]:
    """The owner: a key named like a formula, one like a script (revoked), and chats on the pages; another user: a
    key. The same turns on a rolled-up day, on a day of a stored CSV month, and today."""
    keys = {
        "evil": api_key_create(owner=owner, name=EVIL).key,
        "script": api_key_create(owner=owner, name=SCRIPT).key,
        "other": api_key_create(owner=other_user, name=OTHER).key,
    }
    sessions = [
        (ChatSession.objects.create(owner=owner, rig=usage_rig, model_name="m1", api_key=keys["evil"]), 10, 100, 2.0),
        (ChatSession.objects.create(owner=owner, rig=usage_rig, model_name="m1", api_key=keys["script"]), 20, 200, 3.0),
        (ChatSession.objects.create(owner=owner, rig=usage_rig, model_name="m1"), 30, 300, 4.0),
        (ChatSession.objects.create(owner=owner, rig=usage_rig, model_name="m2", api_key=keys["evil"]), 1, 7, 0.5),
        (ChatSession.objects.create(owner=other_user, rig=usage_rig, model_name="m1", api_key=keys["other"]), 5, 50,
         1.0),
    ]  # fmt: skip
    for days_ago in (0, CLOSED, OLD):
        for session, prompt, output, busy_s in sessions:
            _turn(session, days_ago=days_ago, prompt=prompt, output=output, busy_s=busy_s)
            _turn(session, days_ago=days_ago, prompt=prompt, output=output, busy_s=busy_s)
    api_key_revoke(key_id=keys["script"].pk, actor=owner)
    return keys


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _csv(text: bytes | str) -> list[dict[str, Any]]:
    """The CSV's rows, busy seconds as a number (PostgreSQL writes ``4``, Python ``4.0``)."""
    rows = list(csv.DictReader(io.StringIO(text if isinstance(text, str) else text.decode())))
    return [{**row, "busy_s": float(row["busy_s"])} for row in rows]


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (row["day"], row["user"], row["model"], row["api_key"]))


def _rows() -> list[tuple[Any, ...]]:
    values = UsageDay.objects.values_list("day", "user_id", "model_name", "api_key_id", "turns", "prompt_tokens",
                                          "output_tokens", "busy_s")  # fmt: skip
    return sorted(values, key=lambda row: (*row[:3], row[3] or 0))


def _by_key_reference(user_id: int | None) -> dict[str, tuple[int, int, int, float]]:
    """Each key's sums over 366 days from every turn (inference.turns.usage), by label; "" for no key."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for row in usage.aggregate_usage(usage.usage_records(days=366, user_id=user_id)):
        for i, value in enumerate((row.turns, row.prompt_tokens, row.output_tokens, row.busy_s)):
            totals[row.api_key][i] += value
    return {label: (int(t), int(p), int(o), round(b, 3)) for label, (t, p, o, b) in totals.items()}


def test_each_keys_rows_are_the_same_on_rolled_up_days_as_live_and_as_every_turn_adds_up(owner, keyed):
    context = usage_report.page_context(days=366, user_id=owner.pk, page=1)
    assert UsageDay.objects.filter(api_key=keyed["evil"]).exists(), "rolled up per key"
    today = usage_rollup.today_utc()
    rows: dict[Any, set[tuple[Any, ...]]] = defaultdict(set)
    for r in context["rows"]:
        rows[(today - r.day).days].add((r.user, r.model, r.api_key, r.turns, r.prompt_tokens, r.output_tokens,
                                        r.busy_s))  # fmt: skip
    evil, script = usage.key_label(EVIL, keyed["evil"].pk), usage.key_label(SCRIPT, keyed["script"].pk)
    expected = {
        ("owner", "m1", evil, 2, 20, 200, 4.0),
        ("owner", "m1", script, 2, 40, 400, 6.0),
        ("owner", "m1", "", 2, 60, 600, 8.0),
        ("owner", "m2", evil, 2, 2, 14, 1.0),
    }
    assert rows[0] == rows[CLOSED] == rows[OLD] == expected  # live, rolled up, and rolled up long ago
    by_key = {k.label: (k.turns, k.prompt_tokens, k.output_tokens, k.busy_s) for k in context["by_key"]}
    assert by_key == {
        evil: (12, 66, 642, 15.0),
        script: (6, 120, 1200, 18.0),
        usage.CHAT_PAGES: (6, 180, 1800, 24.0),
    }
    reference = _by_key_reference(owner.pk)
    assert by_key == {label or usage.CHAT_PAGES: sums for label, sums in reference.items()}
    states = {k.label: k.state for k in context["by_key"]}
    assert states[script] == "revoked" and states[evil] == "active"  # a revoked key's usage still shows


def test_a_user_sees_only_their_own_keys_and_staff_see_everyones(owner, other_user, admin_user, keyed):
    own = _client(owner).get("/usage/?days=366")
    labels = {k.label for k in own.context["by_key"]}
    assert labels == {usage.key_label(EVIL, keyed["evil"].pk), usage.key_label(SCRIPT, keyed["script"].pk),
                      usage.CHAT_PAGES}  # fmt: skip
    assert b"other&#x27;s tool" not in own.content
    mine = _csv(_client(owner).get("/usage.csv?days=366").getvalue())
    assert {r["user"] for r in mine} == {"owner"}
    assert not any("other" in r["api_key"] for r in mine)

    other = _client(other_user).get("/usage/?days=366")
    assert [k.label for k in other.context["by_key"]] == [usage.key_label(OTHER, keyed["other"].pk)]
    assert b"C calc" not in other.content and b"alert(1)" not in other.content
    assert _client(other_user).get(f"/usage/?user={owner.pk}").status_code == 404
    assert _client(other_user).get(f"/usage.csv?user={owner.pk}").status_code == 404

    staff = _client(admin_user).get("/usage/?days=366")
    by_key = {k.label: (k.owner, k.turns) for k in staff.context["by_key"]}
    assert by_key[usage.key_label(OTHER, keyed["other"].pk)] == ("other", 6)
    assert by_key[usage.CHAT_PAGES] == ("", 6) and len(by_key) == 4
    assert sum(k.turns for k in staff.context["by_key"]) == staff.context["totals"]["turns"] == 30
    assert _by_key_reference(None).keys() == {k.label if k.key_id else "" for k in staff.context["by_key"]}


def test_key_names_are_escaped_on_the_page_and_made_safe_in_the_csv(owner, keyed):
    page = _client(owner).get("/usage/?days=366")
    assert SCRIPT.encode() not in page.content
    assert b"&lt;script&gt;alert(1)&lt;/script&gt; #" in page.content
    assert b'data-testid="usage-keys"' in page.content and b"(revoked)" in page.content
    text = _client(owner).get("/usage.csv?days=366").getvalue().decode()
    assert text.splitlines()[0] == "day,user,model,turns,prompt_tokens,output_tokens,busy_s,api_key"
    keys = {r["api_key"] for r in _csv(text)}
    assert keys == {f"'{EVIL} #{keyed['evil'].pk}", f"{SCRIPT} #{keyed['script'].pk}", ""}
    assert not any(line.split(",")[-1].startswith("=") for line in text.splitlines())


def test_the_csv_gives_every_turns_rows_with_their_key_written_by_postgresql_or_python(monkeypatch, admin_user, keyed):
    assert usage_csv.in_sql()
    text = _client(admin_user).get("/usage.csv?days=366").getvalue()
    streamed = _csv(text)
    expected = _csv(usage.usage_csv(usage.aggregate_usage(usage.usage_records(days=366, user_id=None))))
    # sorted: closed days are ordered by the names as written (a formula's quote first), live ones as stored
    assert _sorted(streamed) == _sorted(expected) and len(streamed) == 3 * 5
    assert UsageCsvMonth.objects.exclude(body="").exists(), "the old day's month is stored"
    with monkeypatch.context() as patch:  # SQLite's path: the same rows
        patch.setattr(usage_csv, "in_sql", lambda: False)
        assert _csv(_client(admin_user).get("/usage.csv?days=366").getvalue()) == streamed
    assert _client(admin_user).get("/usage.csv?days=366").getvalue() == text  # read back from the stored months


def test_sums_and_csv_months_stored_before_keys_do_not_hide_the_key_rows(owner, admin_user, keyed):
    usage_report.page_context(days=366, user_id=None, page=1)  # stores everyone's sums for the range
    text = _client(admin_user).get("/usage.csv?days=366").getvalue().decode()  # and the closed months
    month = UsageCsvMonth.objects.get(month=(usage_rollup.today_utc() - timedelta(days=OLD)).replace(day=1))
    assert month.body
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(row[:-1] for row in csv.reader(io.StringIO(month.body)))
    stale = out.getvalue()  # no api_key column
    with connection.cursor() as cursor:  # the md5 as it was written before the column
        cursor.execute("SELECT md5(string_agg(id::text || ':' || username, ',' ORDER BY id)) FROM auth_user "
                       "WHERE id = ANY(string_to_array(%s, ',')::bigint[])", [month.user_ids])  # fmt: skip
        (old_md5,) = cursor.fetchone()
    UsageCsvMonth.objects.filter(pk=month.pk).update(body=stale, names_md5=old_md5)
    assert _client(admin_user).get("/usage.csv?days=366").getvalue().decode() == text

    sums = UsageRangeSums.objects.get(scope="*")
    body = orjson.loads(sums.body)
    del body["by_key"]
    body["by_model"] = [[d, m, 1, 1, 1, 1.0] for d, m, *_ in body["by_model"]]  # what it was, less the keys
    UsageRangeSums.objects.filter(pk=sums.pk).update(body=orjson.dumps(body).decode())
    context = usage_report.page_context(days=366, user_id=None, page=1)
    assert context["totals"]["turns"] == 30 and len(context["by_key"]) == 4


def test_the_migration_moves_each_keys_share_of_rows_rolled_up_without_keys(owner, keyed):
    usage_report.page_context(days=366, user_id=None, page=1)  # rolls up per key
    fresh = _rows()
    migration = importlib.import_module("inference.migrations.0019_usageday_split_by_key")
    migration.merge_keys(apps, None)  # as the rollup wrote them before keys
    assert not UsageDay.objects.filter(api_key__isnull=False).exists()
    day = usage_rollup.today_utc() - timedelta(days=CLOSED)
    gone = Turn.objects.filter(session__api_key=keyed["evil"], session__model_name="m2", started_at__date=day).first()
    assert gone is not None
    gone.delete()  # deleted after its day was rolled up: it still counts, without its key
    migration.split_by_key(apps, None)
    after = _rows()
    moved = [(d, u, m, k, 1, 1, 7, 0.5) if (d, m, k) == (day, "m2", keyed["evil"].pk) else (d, u, m, k, *rest)
             for d, u, m, k, *rest in fresh]  # fmt: skip
    assert after == sorted([*moved, (day, owner.pk, "m2", None, 1, 1, 7, 0.5)], key=lambda row: (*row[:3], row[3] or 0))
    assert not UsageRangeSums.objects.exists() and not UsageCsvMonth.objects.exists()
