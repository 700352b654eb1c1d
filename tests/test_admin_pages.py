"""Users page (create, deactivate, roles, groups), the audit log, and usage per day, user and model."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from inference.audit import audit_record
from inference.models import AuditLog, Turn
from inference.turns import usage
from inference.turns.usage import TurnRecord, UsageRow, aggregate_usage, figure_by_day, usage_csv
from tests.adminkit import make_session


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# Users and the audit log ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_creates_a_user_with_a_role_and_groups_and_it_is_audited(admin_user):
    group = Group.objects.create(name="lab")
    admin = _client(admin_user)
    form = {"username": "newbie", "password": "a-long-enough-pass-42", "groups": [group.pk]}
    assert admin.post("/board/users/", form).status_code == 302
    newbie = User.objects.get(username="newbie")
    assert newbie.check_password("a-long-enough-pass-42") and not newbie.is_staff
    assert list(newbie.groups.values_list("name", flat=True)) == ["lab"]
    entry = AuditLog.objects.get()
    assert (entry.action, entry.target) == ("user.create", "user:newbie")
    assert entry.detail == {"is_staff": False, "groups": ["lab"]}
    logged_in = Client().post("/login/", {"username": "newbie", "password": "a-long-enough-pass-42"})
    assert logged_in.status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("username", "password", "message"),
    [("owner", "a-long-enough-pass-42", b"already exists"), ("x y!", "a-long-enough-pass-42", b"valid username"),
     ("fresh", "123", b"too short")],
)  # fmt: skip
def test_bad_new_users_get_a_clear_error_and_nothing_is_created(admin_user, owner, username, password, message):
    response = _client(admin_user).post("/board/users/", {"username": username, "password": password})
    assert response.status_code == 400 and message in response.content
    assert User.objects.count() == 2 and not AuditLog.objects.exists()


@pytest.mark.django_db
def test_roles_and_activation_change_through_the_users_page_with_an_audit_trail(admin_user, owner):
    admin = _client(admin_user)
    group = Group.objects.create(name="lab")
    for action in ("promote", "demote", "deactivate", "activate"):
        assert admin.post(f"/board/users/{owner.pk}/", {"action": action}).status_code == 302
    assert admin.post(f"/board/users/{owner.pk}/", {"action": "groups", "groups": [group.pk]}).status_code == 302
    owner.refresh_from_db()
    assert owner.is_active and not owner.is_staff and owner.groups.get() == group
    assert list(AuditLog.objects.order_by("id").values_list("action", flat=True)) == [
        "user.promote", "user.demote", "user.deactivate", "user.activate", "user.groups",
    ]  # fmt: skip
    # Asking for what already is records nothing; nonsense is refused.
    assert admin.post(f"/board/users/{owner.pk}/", {"action": "activate"}).status_code == 302
    assert admin.post(f"/board/users/{owner.pk}/", {"action": "explode"}).status_code == 400
    assert admin.post("/board/users/999999/", {"action": "deactivate"}).status_code == 404
    # An admin cannot lock themselves out.
    response = admin.post(f"/board/users/{admin_user.pk}/", {"action": "deactivate"})
    assert response.status_code == 400 and b"your own account" in response.content
    assert AuditLog.objects.count() == 5
    page = admin.get("/board/audit/?action=user.")
    assert page.status_code == 200 and page.content.count(b"user:owner") == 5


@pytest.mark.django_db
def test_audit_hook_records_a_system_action_without_an_actor():
    entry = audit_record(actor=None, action="model.pull", target="rig:embedded", detail={"model": "smollm2"})
    assert (entry.actor_name, entry.actor_id, entry.detail) == ("system", None, {"model": "smollm2"})


@pytest.mark.django_db
def test_django_admin_edits_of_users_are_audited_too(admin_user, owner):
    admin = _client(admin_user)
    page = admin.get(f"/admin/auth/user/{owner.pk}/change/")
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("groups", "user_permissions")}
    data.update(is_active="", is_staff="on", last_login_0="", last_login_1="")
    data["date_joined_0"], data["date_joined_1"] = owner.date_joined.strftime("%Y-%m-%d %H:%M:%S").split()
    response = admin.post(f"/admin/auth/user/{owner.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    entry = AuditLog.objects.get()
    assert (entry.action, entry.detail) == ("user.change", {"is_active": False, "is_staff": True})


# Usage -----------------------------------------------------------------------------------------------------

T = datetime(2026, 3, 9, 23, 59, 0, tzinfo=UTC)


def test_usage_adds_up_per_utc_day_user_and_model():
    records = [
        TurnRecord("ann", "m1", T, T, T + timedelta(seconds=2), 10, 20),
        TurnRecord("ann", "m1", T, T + timedelta(seconds=90), T + timedelta(seconds=93), 5, 7),  # next UTC day
        TurnRecord("ann", "m2", T, T, T + timedelta(seconds=1.5), None, None),
        TurnRecord("bob", "m1", T, None, None, None, None),  # cancelled while waiting: a turn, no busy time
    ]
    rows = aggregate_usage(records)
    flat = [(r.day.isoformat(), r.user, r.model, r.turns, r.prompt_tokens, r.output_tokens, r.busy_s) for r in rows]
    assert flat == [
        ("2026-03-09", "ann", "m1", 1, 10, 20, 2.0),
        ("2026-03-09", "ann", "m2", 1, 0, 0, 1.5),
        ("2026-03-09", "bob", "m1", 1, 0, 0, 0.0),
        ("2026-03-10", "ann", "m1", 1, 5, 7, 3.0),
    ]  # fmt: skip


def test_usage_figure_stacks_one_trace_per_model_over_every_day():
    days = [date(2026, 3, 8), date(2026, 3, 9), date(2026, 3, 10)]
    rows = [
        UsageRow(date(2026, 3, 9), "ann", "m1", 1, 0, 20, 2.0),
        UsageRow(date(2026, 3, 9), "bob", "m1", 2, 0, 5, 1.0),
        UsageRow(date(2026, 3, 10), "ann", "m2", 1, 0, 7, 3.0),
        UsageRow(date(2026, 1, 1), "ann", "m2", 9, 0, 99, 9.0),  # outside the days shown
    ]
    fig = figure_by_day(rows, metric="output_tokens", split="model", days=days)
    assert fig["layout"]["barmode"] == "stack"
    assert [(t["name"], t["x"], t["y"]) for t in fig["data"]] == [
        ("m1", ["2026-03-08", "2026-03-09", "2026-03-10"], [0, 25, 0]),
        ("m2", ["2026-03-08", "2026-03-09", "2026-03-10"], [0, 0, 7]),
    ]
    by_user = figure_by_day(rows, metric="busy_s", split="user", days=days)
    assert {t["name"]: t["y"] for t in by_user["data"]} == {"ann": [0, 2.0, 3.0], "bob": [0, 1.0, 0]}
    with pytest.raises(ValueError):
        figure_by_day(rows, metric="secrets", split="user", days=days)


def test_usage_csv_has_a_header_and_neutralises_spreadsheet_formulas():
    rows = [UsageRow(date(2026, 3, 9), "=cmd|'/c calc'!A1", "m1", 1, 2, 3, 4.5)]
    parsed = list(csv.reader(io.StringIO(usage_csv(rows))))
    assert parsed[0] == ["day", "user", "model", "turns", "prompt_tokens", "output_tokens", "busy_s", "api_key"]
    assert parsed[1] == ["2026-03-09", "'=cmd|'/c calc'!A1", "m1", "1", "2", "3", "4.5", ""]


@pytest.fixture
def usage_turns(owner, other_user, rig):
    now = timezone.now()
    for user, model, output in ((owner, "model-a", 30), (owner, "model-b", 12), (other_user, "model-a", 50)):
        Turn.objects.create(
            session=make_session(user, rig, model), user_text="q", status=Turn.Status.DONE, started_at=now,
            finished_at=now + timedelta(seconds=3), prompt_tokens=9, output_tokens=output,
        )  # fmt: skip


@pytest.mark.django_db
def test_a_user_sees_only_their_own_usage_and_an_admin_sees_everyones(owner, admin_user, usage_turns):
    own = _client(owner)
    page = own.get("/usage/")
    assert page.status_code == 200
    assert [r.user for r in page.context["rows"]] == ["owner", "owner"]
    assert page.context["totals"]["output_tokens"] == 42
    mine = list(csv.DictReader(io.StringIO(own.get("/usage.csv?days=7").getvalue().decode())))
    assert {(r["user"], r["model"], r["output_tokens"], r["busy_s"]) for r in mine} == {
        ("owner", "model-a", "30", "3.0"), ("owner", "model-b", "12", "3.0"),
    }  # fmt: skip
    assert own.get(f"/usage/?user={owner.pk}").status_code == 200
    admin = _client(admin_user)
    everyone = admin.get("/usage/")
    assert everyone.context["totals"]["output_tokens"] == 92 and len(everyone.context["figures"]) == 5
    assert b'id="usage-figures"' in everyone.content and b"<script>" not in everyone.content
    just_owner = admin.get(f"/usage.csv?user={owner.pk}").getvalue().decode()
    assert "other" not in just_owner and just_owner.count("owner") == 2
    for bad in ("days=0", "days=400", "days=lots"):
        assert own.get(f"/usage/?{bad}").status_code == 400
        assert own.get(f"/usage.csv?{bad}").json()["error"]["code"] == "bad_days"
    assert admin.get("/usage/?user=999999").status_code == 404


def test_day_range_ends_today():
    assert usage.day_range(3, today=date(2026, 3, 1)) == [date(2026, 2, 27), date(2026, 2, 28), date(2026, 3, 1)]
