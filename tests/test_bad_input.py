"""Bad input gets a clear error, the server keeps going and nothing stored is lost."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import Client

from inference import errors
from inference.models import ChatSession, Rig, Turn
from inference.turns import params as turn_params
from inference.turns import submit
from tests.conftest import free_port, session_cookie_for
from tests.wsclient import ChatSocket


@pytest.fixture
def owner_client(owner):
    client = Client()
    client.force_login(owner)
    return client


def _post_turn(client, session_id, body):
    return client.post(f"/api/sessions/{session_id}/turns", body, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"text": ""}, "empty_message"),
        ({"text": "   \n"}, "empty_message"),
        ({}, "empty_message"),
        ({"text": 42}, "empty_message"),
        ({"text": "x" * 16_001}, "message_too_long"),
        ({"text": "hi", "params": {"temperature": 9}}, "bad_params"),
        ({"text": "hi", "params": {"max_tokens": 10**6}}, "bad_params"),
        ({"text": "hi", "params": {"grammar": "root ::= x"}}, "bad_params"),
        ({"text": "hi", "params": {"temperature": True}}, "bad_params"),
        ({"text": "hi", "params": "hot"}, "bad_params"),
    ],
)
def test_bad_turn_input_is_refused_with_its_reason(owner_client, chat_session, body, code):
    earlier = Turn.objects.create(session=chat_session, user_text="kept", reply_text="kept", status="done")
    response = _post_turn(owner_client, chat_session.pk, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]
    assert list(Turn.objects.values_list("pk", "reply_text")) == [(earlier.pk, "kept")]


@pytest.mark.django_db
def test_malformed_json_body_is_refused(owner_client, chat_session):
    response = owner_client.post(f"/api/sessions/{chat_session.pk}/turns", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_json"


@pytest.mark.django_db
def test_unknown_model_is_refused_when_starting_a_chat(owner_client, rig):
    response = owner_client.post("/sessions/new", {"rig": rig.pk, "model": "llama-70b-does-not-exist"})
    assert response.status_code == 400
    assert b"does not serve a model named" in response.content
    assert ChatSession.objects.count() == 0


@pytest.mark.django_db
def test_starting_a_chat_with_a_served_model_works(owner_client, rig, model_name):
    response = owner_client.post("/sessions/new", {"rig": rig.pk, "model": model_name})
    assert response.status_code == 302
    assert ChatSession.objects.get().model_name == model_name


@pytest.mark.django_db
def test_rig_that_is_down_is_shown_as_unavailable(owner_client):
    Rig.objects.create(name="down", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="rig.down")
    page = owner_client.get("/")
    assert page.status_code == 200
    assert b"unavailable" in page.content and b"Rig down: the backend could not be reached" in page.content
    assert b"unreachable" not in page.content  # the backend's detail (its URL) is for staff


@pytest.mark.django_db(transaction=True)
async def test_bad_websocket_frames_get_error_frames_and_the_socket_survives(chat_session, owner):
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    cases = [
        ("{not json", "bad_json"),
        ("[1, 2]", "bad_frame"),
        (json.dumps({"type": "launch.missiles"}), "unknown_type"),
        (
            json.dumps({"type": "turn.send", "text": "a" * (settings.RIGDASH.max_ws_frame_bytes + 10)}),
            "frame_too_large",
        ),
        (json.dumps({"type": "turn.send", "text": ""}), "empty_message"),
        (json.dumps({"type": "turn.cancel", "turn": "abc"}), "not_found"),
        (json.dumps({"type": "turn.resync", "turn": 999_999}), "not_found"),
    ]
    for raw, code in cases:
        await sock.send_raw(raw)
        reply = await sock.recv()
        assert reply["type"] == "error" and reply["code"] == code, (raw[:40], reply)
        assert reply["message"]
    await sock.send_raw(json.dumps({"type": "turn.resync", "turn": 999_999}))
    assert (await sock.recv())["type"] == "error"  # still connected and answering
    await sock.close()
    assert await Turn.objects.acount() == 0


@pytest.mark.django_db
def test_cancel_of_a_finished_turn_says_so_and_changes_nothing(owner_client, chat_session):
    turn = Turn.objects.create(session=chat_session, user_text="q", reply_text="a", status=Turn.Status.DONE)
    response = owner_client.post(f"/api/turns/{turn.pk}/cancel")
    assert response.status_code == 400 and response.json()["error"]["code"] == "turn_finished"
    turn.refresh_from_db()
    assert (turn.status, turn.reply_text, turn.cancel_requested) == ("done", "a", False)


@pytest.mark.django_db
def test_second_message_while_a_turn_runs_is_refused(owner_client, chat_session):
    Turn.objects.create(session=chat_session, user_text="first", status=Turn.Status.DECODING)
    response = _post_turn(owner_client, chat_session.pk, {"text": "second"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "turn_in_progress"


def test_params_validate_keeps_allowed_values_and_types():
    assert turn_params.params_validate({"temperature": 0, "max_tokens": 12.0, "seed": 3}) == {
        "temperature": 0.0,
        "max_tokens": 12,
        "seed": 3,
    }
    with pytest.raises(errors.InvalidInput):
        turn_params.params_validate({"max_tokens": 1.5})


@pytest.mark.django_db(transaction=True)
def test_backend_down_mid_chat_fails_the_turn_with_a_reason_and_keeps_history(celery_worker, owner, model_name):
    """The rig's server refuses connections: the turn fails clearly, earlier turns stay."""
    from tests.conftest import TEST_QUEUE, wait_until

    rig = Rig.objects.create(name="gone", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue=TEST_QUEUE)
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
    earlier = Turn.objects.create(session=session, user_text="old", reply_text="old reply", status="done")
    turn = submit.turn_submit(session=session, text="hello?")
    turn = wait_until(
        lambda: Turn.objects.filter(pk=turn.pk).exclude(status__in=Turn.ACTIVE).first(), timeout_s=30, what="failure"
    )
    assert turn.status == Turn.Status.FAILED
    assert turn.finish_reason == "backend_unavailable"
    assert turn.error.startswith("Rig gone: the backend could not be reached")
    assert "127.0.0.1" not in turn.error and "unreachable" in turn.stats["error_detail"]  # the detail: staff only
    earlier.refresh_from_db()
    assert earlier.reply_text == "old reply"


@pytest.mark.django_db(transaction=True)
async def test_a_submit_whose_task_cannot_be_queued_is_kept_and_the_page_is_told_why(chat_session, owner, broker_down):
    """The broker refuses the Celery message (mocked, see ``broker_down``). The turn is stored and waits; the page
    sees it queued and gets an error frame that says so, and its socket stays open (it used to get an unhandled
    exception instead)."""
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()  # the session's snapshot
    await sock.send({"type": "turn.send", "text": "keep me", "client_id": "c1"})
    await sock.recv_until(lambda f: {"turn.queued", "error"} <= {frame["type"] for frame in sock.frames})
    [queued] = [f for f in sock.frames if f["type"] == "turn.queued"]  # it comes through Redis, the error directly
    [error] = [f for f in sock.frames if f["type"] == "error"]
    assert queued["turn"]["user_text"] == "keep me"
    assert error["code"] == "queue_unavailable" and "saved" in error["message"] and error["request"] == "c1"
    await sock.send({"type": "turn.resync", "turn": queued["turn"]["id"]})
    snapshot = await sock.recv_until(lambda f: f["type"] == "turn.snapshot")  # still connected and answering
    assert snapshot["turn"]["status"] == Turn.Status.QUEUED
    await sock.close()
    turn = await Turn.objects.aget()
    assert (turn.user_text, turn.status, turn.dispatched_at) == ("keep me", Turn.Status.QUEUED, None)


@pytest.mark.django_db(transaction=True)  # the Celery message goes at the commit
def test_a_turn_posted_while_its_task_cannot_be_queued_is_kept_and_the_answer_says_so(
    owner_client, chat_session, broker_down
):
    response = _post_turn(owner_client, chat_session.pk, {"text": "keep me too"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "queue_unavailable" and "saved" in response.json()["error"]["message"]
    turn = Turn.objects.get(session=chat_session)
    assert (turn.user_text, turn.status, turn.dispatched_at) == ("keep me too", Turn.Status.QUEUED, None)
