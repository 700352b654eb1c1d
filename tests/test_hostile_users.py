"""Hostile input from users: numbers that are not finite, ids out of range, one submit failing in a burst."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import DataError
from django.test import Client

from inference import errors
from inference.models import ChatSession, Rig, Turn
from inference.turns import params as turn_params
from inference.turns import submit, submit_queue
from rigdash.ws import parse_frame
from tests.conftest import session_cookie_for
from tests.wsclient import ChatSocket

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.fixture
def idle_session(owner) -> ChatSession:
    """A session on a rig nobody serves: submits are stored and wait."""
    rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
    return ChatSession.objects.create(owner=owner, rig=rig, model_name="m")


@pytest.mark.parametrize("name", sorted(turn_params.NUMBER_RULES))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_every_param_refuses_non_finite_numbers(settings, name, value):
    with pytest.raises(errors.InvalidInput) as info:
        turn_params.params_validate({name: value})
    assert info.value.code == "bad_params"


@pytest.mark.parametrize("number", NON_FINITE)
def test_a_frame_with_a_non_finite_number_is_refused_by_the_parser(number):
    assert parse_frame('{"type": "turn.cancel", "turn": %s}' % number)[0] == "bad_json"  # noqa: UP031


def test_a_frame_nested_too_deep_is_refused_by_the_parser():
    assert parse_frame("[" * 20_000 + "]" * 20_000)[0] == "bad_json"


@pytest.mark.django_db
@pytest.mark.parametrize("number", NON_FINITE)
def test_http_submit_with_a_non_finite_param_is_a_400_and_stores_nothing(owner, idle_session, number):
    client = Client()
    client.force_login(owner)
    body = '{"text": "hi", "params": {"max_tokens": %s}}' % number  # noqa: UP031
    response = client.post(f"/api/sessions/{idle_session.pk}/turns", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"
    assert not Turn.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_non_finite_and_out_of_range_numbers_on_a_socket_get_an_error_frame_and_the_socket_goes_on(
    owner, idle_session
):
    sock = ChatSocket(idle_session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()  # session.snapshot
    frames = [
        '{"type": "turn.send", "text": "hi", "params": {"max_tokens": 1e400}}',
        '{"type": "turn.send", "text": "hi", "params": {"temperature": NaN}}',
        '{"type": "turn.cancel", "turn": Infinity}',
        '{"type": "turn.cancel", "turn": 100000000000000000000000000000}',
        '{"type": "turn.resync", "turn": -5}',
        '{"type": "turn.cancel", "turn": true}',
    ]
    for frame in frames:
        await sock.send_raw(frame)
        reply = await sock.recv(timeout=10)
        assert reply["type"] == "error", (frame, reply)
        assert reply["code"] in ("bad_json", "not_found"), (frame, reply)
    await sock.send({"type": "turn.send", "text": "still here"})
    queued = await sock.recv_until(lambda f: f["type"] in ("turn.queued", "error"), timeout=20)
    assert queued["type"] == "turn.queued", queued
    await sock.close()


@pytest.mark.django_db(transaction=True)
def test_one_submit_that_fails_unexpectedly_in_a_burst_leaves_the_others_stored(owner, other_user, monkeypatch):
    rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
    mine = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    theirs = ChatSession.objects.create(owner=other_user, rig=rig, model_name="m")
    prepare = submit._turn_prepare

    def fragile(**kwargs: Any) -> Turn:
        if kwargs["text"] == "poison":
            raise OverflowError("a check nobody wrote")
        return prepare(**kwargs)

    monkeypatch.setattr(submit, "_turn_prepare", fragile)
    results = submit.turn_submit_many(
        [
            submit.SubmitRequest(user=owner, session_id=mine.pk, text="poison"),
            submit.SubmitRequest(user=other_user, session_id=theirs.pk, text="fine"),
        ]
    )
    assert isinstance(results[0], errors.InvalidInput) and results[0].code == "bad_request"
    assert isinstance(results[1], Turn)
    assert list(Turn.objects.values_list("user_text", flat=True)) == ["fine"]


@pytest.mark.django_db(transaction=True)
async def test_a_database_error_in_a_burst_is_retried_one_by_one_so_only_its_submit_fails(
    owner, other_user, monkeypatch
):
    def setup() -> tuple[int, int]:
        rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
        mine = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
        theirs = ChatSession.objects.create(owner=other_user, rig=rig, model_name="m")
        return mine.pk, theirs.pk

    mine, theirs = await sync_to_async(setup)()
    real = submit.turn_submit_many

    def flaky(requests: Any) -> Any:
        if any(r.text == "poison" for r in requests):
            raise DataError("value out of range")
        return real(requests)

    monkeypatch.setattr(submit, "turn_submit_many", flaky)
    outcomes = await asyncio.gather(
        submit_queue.submit(user=owner, session_id=mine, text="first"),
        submit_queue.submit(user=owner, session_id=mine, text="poison"),
        submit_queue.submit(user=other_user, session_id=theirs, text="fine"),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], Turn)
    assert isinstance(outcomes[1], DataError)
    assert isinstance(outcomes[2], Turn)


@pytest.mark.django_db(transaction=True)
async def test_a_burst_of_submits_from_several_sockets_passes_a_concurrent_quota_of_one_once(owner):
    from inference.models import Quota

    def setup() -> list[int]:
        rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
        Quota.objects.create(user=owner, max_concurrent_turns=1)
        return [ChatSession.objects.create(owner=owner, rig=rig, model_name="m").pk for _ in range(5)]

    session_ids = await sync_to_async(setup)()
    cookie = await sync_to_async(session_cookie_for)(owner)
    sockets = [ChatSocket(session_id, cookie) for session_id in session_ids]
    for sock in sockets:
        assert (await sock.connect())[0]
        await sock.recv()  # session.snapshot
    await asyncio.gather(*(sock.send({"type": "turn.send", "text": "go"}) for sock in sockets))
    answers = [await sock.recv_until(lambda f: f["type"] in ("turn.queued", "error"), timeout=20) for sock in sockets]
    assert sorted(a["type"] for a in answers) == ["error"] * 4 + ["turn.queued"], answers
    assert {a["code"] for a in answers if a["type"] == "error"} == {"quota_concurrent_turns"}
    assert await Turn.objects.filter(session__owner=owner).acount() == 1
    for sock in sockets:
        await sock.close()


@pytest.mark.django_db
def test_the_reaper_reaps_each_stale_turn_on_its_own(owner, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone
    from redis.exceptions import ConnectionError as RedisConnectionError

    from inference.live import state
    from inference.turns import lifecycle

    rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
    old = timezone.now() - timedelta(minutes=5)
    turns = [
        Turn.objects.create(
            session=ChatSession.objects.create(owner=owner, rig=rig, model_name="m"),
            user_text=f"q{i}",
            status=Turn.Status.DECODING,
            heartbeat_at=old,
            reply_text=f"checkpoint {i}",
        )
        for i in range(4)
    ]
    snapshot, finish = state.snapshot, lifecycle.turn_finish

    def odd_snapshot(turn_id: int) -> Any:
        if turn_id == turns[1].pk:
            raise RedisConnectionError("Redis is down")
        if turn_id == turns[2].pk:
            raise ValueError("an odd live list")
        return snapshot(turn_id)

    def failing_finish(*, turn: Turn, outcome: Any) -> bool:
        if turn.pk == turns[3].pk:
            raise DataError("the database refused this one")
        return finish(turn=turn, outcome=outcome)

    monkeypatch.setattr(state, "snapshot", odd_snapshot)
    monkeypatch.setattr(lifecycle, "turn_finish", failing_finish)
    assert sorted(lifecycle.turn_reap_stale(older_than_s=60)) == sorted(t.pk for t in turns[:3])
    ended = {t.pk: (t.status, t.reply_text) for t in Turn.objects.filter(pk__in=[t.pk for t in turns[:3]])}
    assert ended == {t.pk: (Turn.Status.INTERRUPTED, f"checkpoint {i}") for i, t in enumerate(turns[:3])}
    monkeypatch.setattr(lifecycle, "turn_finish", finish)
    assert lifecycle.turn_reap_stale(older_than_s=60) == [turns[3].pk]  # the next pass tries it again
