"""The other user cannot read, stream or stop the owner's session by any HTTP or websocket route."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from inference.models import Turn
from tests.conftest import session_cookie_for
from tests.wsclient import ChatSocket


@pytest.fixture
def owners_turn(chat_session):
    return Turn.objects.create(
        session=chat_session, user_text="secret question", reply_text="secret answer", status=Turn.Status.DONE
    )


@pytest.fixture
def other_client(other_user):
    client = Client()
    client.force_login(other_user)
    return client


@pytest.mark.django_db
def test_other_user_gets_404_from_every_http_route(other_client, chat_session, owners_turn):
    sid, tid = chat_session.pk, owners_turn.pk
    responses = {
        "chat page": other_client.get(f"/sessions/{sid}/"),
        "history": other_client.get(f"/api/sessions/{sid}/turns"),
        "submit": other_client.post(f"/api/sessions/{sid}/turns", {"text": "hi"}, content_type="application/json"),
        "turn": other_client.get(f"/api/turns/{tid}"),
        "cancel": other_client.post(f"/api/turns/{tid}/cancel"),
    }
    for route, response in responses.items():
        assert response.status_code == 404, route
        assert b"secret" not in response.content, route
    assert Turn.objects.count() == 1
    listing = other_client.get("/")
    assert listing.status_code == 200 and b"secret question" not in listing.content


@pytest.mark.django_db
def test_owner_reaches_the_same_routes(chat_session, owners_turn, owner):
    client = Client()
    client.force_login(owner)
    assert client.get(f"/sessions/{chat_session.pk}/").status_code == 200
    history = client.get(f"/api/sessions/{chat_session.pk}/turns").json()
    assert history["turns"][0]["reply"] == "secret answer"
    assert client.get(f"/api/turns/{owners_turn.pk}").json()["turn"]["user_text"] == "secret question"


@pytest.mark.django_db
def test_anonymous_is_sent_to_login_or_refused(chat_session, owners_turn):
    client = Client()
    assert client.get(f"/sessions/{chat_session.pk}/").status_code == 302
    assert client.get(f"/api/turns/{owners_turn.pk}").status_code == 401


@pytest.mark.django_db(transaction=True)
async def test_other_user_cannot_open_the_owners_chat_socket(chat_session, other_user):
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(other_user))
    connected, code = await sock.connect()
    assert not connected and code == 4404


@pytest.mark.django_db(transaction=True)
async def test_anonymous_and_foreign_origin_sockets_are_refused(chat_session, owner):
    anonymous = ChatSocket(chat_session.pk, None)
    assert not (await anonymous.connect())[0]
    foreign = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner), origin="http://evil.example")
    assert not (await foreign.connect())[0]


@pytest.mark.django_db(transaction=True)
async def test_other_user_cannot_stop_or_resync_the_owners_turn_through_their_own_socket(
    chat_session, owners_turn, other_user, rig, model_name
):
    from inference.models import ChatSession

    theirs = await ChatSession.objects.acreate(owner=other_user, rig=rig, model_name=model_name)
    await Turn.objects.filter(pk=owners_turn.pk).aupdate(status=Turn.Status.QUEUED)
    sock = ChatSocket(theirs.pk, await sync_to_async(session_cookie_for)(other_user))
    assert (await sock.connect())[0]
    await sock.recv()
    for frame_type in ("turn.cancel", "turn.resync"):
        await sock.send({"type": frame_type, "turn": owners_turn.pk})
        reply = await sock.recv()
        assert reply["type"] == "error" and reply["code"] == "not_found", reply
        assert "secret" not in str(reply)
    await sock.close()
    turn = await Turn.objects.aget(pk=owners_turn.pk)
    assert turn.status == Turn.Status.QUEUED and not turn.cancel_requested
