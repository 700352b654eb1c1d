"""Quotas: which limits apply, validation, refusals with the limit and its reset, and caps on running turns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from inference import errors, tokens
from inference.forms import QuotaForm
from inference.models import AuditLog, Quota, Turn
from inference.queue import quotas
from inference.queue.quotas import Limits, limits_merge
from inference.turns import submit
from inference.worker import start as starts
from tests.adminkit import make_session, quiet

# Pure pieces -------------------------------------------------------------------------------------------


def test_own_quota_wins_then_the_most_generous_group_then_the_default():
    own = {"max_concurrent_turns": 2, "max_output_tokens_per_day": None}
    groups = [
        {"max_output_tokens_per_day": 1000, "max_tokens_per_reply": 100, "max_concurrent_turns": 9},
        {"max_output_tokens_per_day": 5000, "max_tokens_per_reply": None},
    ]
    default = {"max_output_tokens_per_day": 10, "max_tokens_per_reply": 50, "max_context_tokens": 4096}
    merged = limits_merge(own=own, groups=groups, default=default)
    assert merged == Limits(
        max_concurrent_turns=2, max_output_tokens_per_day=5000, max_tokens_per_reply=100, max_context_tokens=4096
    )
    assert limits_merge(own=None, groups=[], default=None) == Limits()


def test_daily_allowance_resets_at_the_next_utc_midnight():
    now = datetime(2026, 3, 9, 22, 30, tzinfo=UTC)
    assert quotas.next_reset_utc(now) == datetime(2026, 3, 10, tzinfo=UTC)
    assert "00:00 UTC on 2026-03-10 (in 1 h 30 min)" in quotas.describe_reset(quotas.next_reset_utc(now), now)
    late = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert quotas.next_reset_utc(late) == datetime(2027, 1, 1, tzinfo=UTC)


def test_prompt_estimate_counts_text_and_template_overhead():
    assert tokens.estimate_tokens("") == 0 and tokens.estimate_tokens("abcde") == 2
    messages = [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "y" * 40}]
    assert tokens.estimate_prompt_tokens(messages) == 100 + 4 + 10 + 4 + 2
    with pytest.raises(errors.QuotaExceeded) as info:
        quotas.context_check(prompt_tokens=300, limit=200, estimated=False)
    assert info.value.code == "quota_context_tokens" and "300 tokens" in info.value.message
    quotas.context_check(prompt_tokens=200, limit=200, estimated=True)  # at the limit is allowed


# Validation --------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_concurrent_turns", "-1", "greater than or equal to"),
        ("max_output_tokens_per_day", "0", "greater than or equal to 1"),
        ("max_tokens_per_reply", "1000000", "less than or equal to 32768"),
        ("max_context_tokens", "99999999999999999999", "less than or equal to"),
        ("max_concurrent_turns", "lots", "whole number"),
    ],
)
def test_quota_form_refuses_negative_zero_and_absurd_values(owner, field, value, message):
    form = QuotaForm({"user": owner.pk, field: value})
    assert not form.is_valid()
    assert message in " ".join(form.errors[field])


@pytest.mark.django_db
def test_quota_is_for_one_user_or_one_group_and_there_is_one_default(owner):
    group = Group.objects.create(name="students")
    with pytest.raises(ValidationError, match="not both"):
        Quota(user=owner, group=group, max_concurrent_turns=1).full_clean()
    Quota.objects.create(max_concurrent_turns=3)
    with pytest.raises(ValidationError, match="already a default quota"):
        Quota(max_concurrent_turns=1).full_clean()
    form = QuotaForm({"user": owner.pk, "max_concurrent_turns": "2"})
    assert form.is_valid(), form.errors
    form.save()
    assert not QuotaForm({"user": owner.pk, "max_concurrent_turns": "4"}).is_valid()  # one quota per user


@pytest.mark.django_db
def test_a_users_limits_come_from_their_own_their_groups_and_the_default_quota_in_one_query(
    owner, other_user, django_assert_num_queries
):
    mine, theirs, also_mine = (Group.objects.create(name=n) for n in ("mine", "theirs", "also-mine"))
    owner.groups.add(mine, also_mine)
    other_user.groups.add(theirs)
    Quota.objects.create(max_concurrent_turns=1, max_output_tokens_per_day=10, max_context_tokens=100)  # default
    Quota.objects.create(group=mine, max_output_tokens_per_day=500, max_tokens_per_reply=50)
    Quota.objects.create(group=also_mine, max_output_tokens_per_day=700)
    Quota.objects.create(group=theirs, max_output_tokens_per_day=9000, max_tokens_per_reply=9000)
    Quota.objects.create(user=owner, max_tokens_per_reply=64)
    Quota.objects.create(user=other_user, max_concurrent_turns=9, max_context_tokens=9000)
    with django_assert_num_queries(1):
        limits = quotas.limits_for(owner.pk)
    # own per-reply; the more generous of the owner's two groups per day; the default for the rest
    assert limits == Limits(
        max_concurrent_turns=1, max_output_tokens_per_day=700, max_tokens_per_reply=64, max_context_tokens=100
    )
    assert quotas.limits_for(other_user.pk) == Limits(
        max_concurrent_turns=9, max_output_tokens_per_day=9000, max_tokens_per_reply=9000, max_context_tokens=9000
    )


@pytest.mark.django_db
def test_quota_page_refuses_bad_values_with_a_clear_error_and_saves_nothing(admin_user, owner):
    client = Client()
    client.force_login(admin_user)
    response = client.post("/board/quotas/", {"user": owner.pk, "max_output_tokens_per_day": "-5"})
    assert response.status_code == 400
    assert b"greater than or equal to 1" in response.content
    assert not Quota.objects.exists() and not AuditLog.objects.exists()
    response = client.post("/board/quotas/", {"user": owner.pk, "max_output_tokens_per_day": "5000"})
    assert response.status_code == 302
    quota = Quota.objects.get()
    assert quota.max_output_tokens_per_day == 5000
    entry = AuditLog.objects.get()
    assert (entry.action, entry.actor_name, entry.target) == ("quota.create", "admin", "quota for user owner")
    response = client.post(f"/board/quotas/{quota.pk}/", {"user": owner.pk, "max_output_tokens_per_day": "6000"})
    assert response.status_code == 302
    update = AuditLog.objects.filter(action="quota.update").get()
    assert update.detail["before"]["max_output_tokens_per_day"] == 5000
    assert update.detail["after"]["max_output_tokens_per_day"] == 6000


# Refusals at submit ------------------------------------------------------------------------------------


def _done_turn(session, *, output_tokens: int, started_at: datetime) -> Turn:
    return Turn.objects.create(
        session=session, user_text="q", reply_text="a", status=Turn.Status.DONE, started_at=started_at,
        finished_at=started_at + timedelta(seconds=1), output_tokens=output_tokens, prompt_tokens=10,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_concurrent_turn_limit_refuses_a_second_running_turn_by_every_route(owner, rig, model_name):
    quiet(rig)
    Quota.objects.create(user=owner, max_concurrent_turns=1)
    busy = make_session(owner, rig, model_name)
    Turn.objects.create(session=busy, user_text="running", status=Turn.Status.DECODING)
    second = make_session(owner, rig, model_name)
    with pytest.raises(errors.QuotaExceeded) as info:
        submit.turn_submit(session=second, text="hello")
    assert info.value.code == "quota_concurrent_turns"
    assert "limit is 1 at once" in info.value.message
    client = Client()
    client.force_login(owner)
    response = client.post(f"/api/sessions/{second.pk}/turns", {"text": "hi"}, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "quota_concurrent_turns"
    assert Turn.objects.count() == 1
    Turn.objects.filter(session=busy).update(status=Turn.Status.DONE)  # it ended: the limit frees up
    assert submit.turn_submit(session=second, text="hello").status == Turn.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_daily_token_limit_refuses_until_utc_midnight_and_group_quota_applies(owner, other_user, rig, model_name):
    quiet(rig)
    group = Group.objects.create(name="trial")
    owner.groups.add(group)
    Quota.objects.create(group=group, max_output_tokens_per_day=100)
    session = make_session(owner, rig, model_name)
    _done_turn(session, output_tokens=100, started_at=timezone.now() - timedelta(seconds=5))
    with pytest.raises(errors.QuotaExceeded) as info:
        submit.turn_submit(session=session, text="more please")
    tomorrow = quotas.next_reset_utc(timezone.now())
    assert info.value.code == "quota_output_tokens_per_day"
    assert info.value.resets_at == tomorrow
    assert "used 100 of your 100 reply tokens for today" in info.value.message
    assert f"resets at 00:00 UTC on {tomorrow:%Y-%m-%d}" in info.value.message
    # The other user is not in the group: not limited.
    assert submit.turn_submit(session=make_session(other_user, rig, model_name), text="hi").pk
    # Yesterday's tokens do not count today: the same usage a day earlier lets the turn through.
    Turn.objects.filter(session=session).update(started_at=quotas.day_start_utc(timezone.now()) - timedelta(seconds=1))
    assert submit.turn_submit(session=session, text="more please").status == Turn.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_per_reply_and_context_limits_refuse_with_the_limit_named(owner, rig, model_name):
    quiet(rig)
    Quota.objects.create(user=owner, max_tokens_per_reply=64, max_context_tokens=100)
    session = make_session(owner, rig, model_name)
    with pytest.raises(errors.QuotaExceeded) as info:
        submit.turn_submit(session=session, text="hi", params={"max_tokens": 65})
    assert info.value.code == "quota_tokens_per_reply" and "limit of 64 per reply" in info.value.message
    with pytest.raises(errors.QuotaExceeded) as info:
        submit.turn_submit(session=session, text="word " * 200)
    assert info.value.code == "quota_context_tokens" and "(estimated)" in info.value.message
    # The estimate builds on the backend's count of the last prompt, not on characters alone.
    _done_turn(session, output_tokens=40, started_at=timezone.now())
    Turn.objects.filter(session=session).update(prompt_tokens=58)
    with pytest.raises(errors.QuotaExceeded, match="about 105 tokens"):
        submit.turn_submit(session=session, text="hi")  # 58 + 40 + (1 + 4 + 2)
    assert Turn.objects.count() == 1


# Caps while a turn runs (the real llama-server) ----------------------------------------------------------


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_running_turn_is_capped_by_the_per_reply_limit_and_todays_allowance(owner, rig, model_name):
    Quota.objects.create(user=owner, max_tokens_per_reply=12, max_output_tokens_per_day=1000)
    session = make_session(owner, rig, model_name)
    story = "Write a long story about a lighthouse."
    turn = Turn.objects.create(session=session, user_text=story, params={"temperature": 0.7, "seed": 1})
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert (turn.status, turn.finish_reason, turn.token_cap) == (Turn.Status.DONE, "length", 12)
    assert turn.output_tokens == 12 == turn.stats["backend_timings"]["predicted_n"]
    # 12 used + 983 from an earlier turn today: 5 tokens are left, so the next reply gets 5.
    _done_turn(session, output_tokens=983, started_at=timezone.now())
    second = Turn.objects.create(session=session, user_text=story, params={"temperature": 0.7, "seed": 2})
    assert starts.turn_run(second.pk) == "ran"
    second.refresh_from_db()
    assert (second.finish_reason, second.token_cap, second.output_tokens) == ("length", 5, 5)
    # Nothing left: a turn that waited while the allowance ran out fails before reaching the backend.
    third = Turn.objects.create(session=session, user_text=story)
    assert starts.turn_run(third.pk) == "ran"
    third.refresh_from_db()
    assert (third.status, third.finish_reason) == (Turn.Status.FAILED, "quota_output_tokens_per_day")
    assert "resets at 00:00 UTC" in third.error and third.reply_text == ""


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_backend_prompt_count_over_the_context_limit_stops_the_turn(owner, rig, model_name):
    """ "hi" is estimated at 7 tokens; SmolLM2's chat template makes it about 30: the backend's count decides."""
    Quota.objects.create(user=owner, max_context_tokens=20)
    session = make_session(owner, rig, model_name)
    turn = Turn.objects.create(session=session, user_text="hi", params={"max_tokens": 200})
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert (turn.status, turn.finish_reason) == (Turn.Status.FAILED, "quota_context_tokens")
    assert "the backend's count" in turn.error and "limit is 20 tokens" in turn.error
    assert turn.stats["output_events"] <= 1
