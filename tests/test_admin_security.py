"""Two ordinary users and an admin: neither user sees or stops the other's turns by any route, and a user
deactivated or demoted while connected loses their sockets within seconds."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from inference.models import AuditLog, Turn
from rigdash import ws
from tests.adminkit import closed_with, make_session, make_user
from tests.conftest import session_cookie_for
from tests.wsclient import BoardSocket, ChatSocket


@pytest.fixture
def two_users_turns(owner, other_user, rig, model_name):
    """Each ordinary user has a session with a waiting turn (stored directly: nothing runs it)."""
    mine = make_session(owner, rig, model_name)
    theirs = make_session(other_user, rig, model_name)
    return (
        Turn.objects.create(session=mine, user_text="owner secret", status=Turn.Status.QUEUED),
        Turn.objects.create(session=theirs, user_text="other secret", status=Turn.Status.QUEUED),
    )


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_neither_user_reaches_the_others_turns_by_any_http_route(owner, other_user, two_users_turns):
    for user, victim in ((owner, two_users_turns[1]), (other_user, two_users_turns[0])):
        client = _client(user)
        sid, tid = victim.session_id, victim.pk
        responses = {
            "chat page": client.get(f"/sessions/{sid}/"),
            "history": client.get(f"/api/sessions/{sid}/turns"),
            "submit": client.post(f"/api/sessions/{sid}/turns", {"text": "x"}, content_type="application/json"),
            "turn": client.get(f"/api/turns/{tid}"),
            "cancel": client.post(f"/api/turns/{tid}/cancel"),
            "board cancel": client.post(f"/board/api/turns/{tid}/cancel"),
            "board turns": client.get("/board/api/turns"),
            "usage of the other": client.get(f"/usage/?user={victim.session.owner_id}"),
            "usage csv of the other": client.get(f"/usage.csv?user={victim.session.owner_id}"),
        }
        for route, response in responses.items():
            assert response.status_code == 404, (user.username, route, response.status_code)
            assert b"secret" not in response.content, route
        own_usage = client.get("/usage.csv").getvalue().decode()
        assert victim.session.owner.username not in own_usage
    assert all(t.status == Turn.Status.QUEUED and not t.cancel_requested for t in Turn.objects.all())
    assert Turn.objects.count() == 2 and not AuditLog.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_neither_user_opens_the_others_chat_socket_or_any_board_socket(owner, other_user, two_users_turns):
    for user, victim in ((owner, two_users_turns[1]), (other_user, two_users_turns[0])):
        cookie = await sync_to_async(session_cookie_for)(user)
        assert await ChatSocket(victim.session_id, cookie).connect() == (False, 4404)
        assert await BoardSocket(cookie).connect() == (False, 4403)
        # Their own socket cannot stop the other's turn either.
        own_session = await Turn.objects.exclude(pk=victim.pk).values_list("session_id", flat=True).aget()
        sock = ChatSocket(own_session, cookie)
        assert (await sock.connect())[0]
        await sock.recv()
        await sock.send({"type": "turn.cancel", "turn": victim.pk})
        assert (await sock.recv())["code"] == "not_found"
        await sock.close()
    assert not await Turn.objects.filter(cancel_requested=True).aexists()


@pytest.mark.django_db(transaction=True)
async def test_user_deactivated_on_the_users_page_is_closed_out_at_once(owner, admin_user, chat_session):
    cookie = await sync_to_async(session_cookie_for)(owner)
    sock = ChatSocket(chat_session.pk, cookie)
    assert (await sock.connect())[0]
    await sock.recv()
    admin = await sync_to_async(_client)(admin_user)
    started = time.monotonic()
    response = await sync_to_async(admin.post)(f"/board/users/{owner.pk}/", {"action": "deactivate"})
    assert response.status_code == 302
    assert await closed_with(sock.comm, timeout=2) == 4401
    assert time.monotonic() - started < 2
    entry = await AuditLog.objects.aget()
    assert (entry.actor_name, entry.action, entry.target) == ("admin", "user.deactivate", "user:owner")
    # The same session cookie opens nothing any more, by websocket or HTTP.
    assert await ChatSocket(chat_session.pk, cookie).connect() == (False, 4401)
    client = Client()
    client.cookies["sessionid"] = cookie
    assert (await sync_to_async(client.get)(f"/api/turns/{chat_session.pk}")).status_code == 401


@pytest.mark.django_db(transaction=True)
async def test_user_deactivated_in_django_admin_or_directly_in_the_database_is_closed_within_seconds(
    owner, other_user, rig, model_name, monkeypatch
):
    monkeypatch.setattr(ws, "RECHECK_INTERVAL_S", 0.5)
    owners = ChatSocket(
        (await sync_to_async(make_session)(owner, rig, model_name)).pk, await sync_to_async(session_cookie_for)(owner)
    )
    others = ChatSocket(
        (await sync_to_async(make_session)(other_user, rig, model_name)).pk,
        await sync_to_async(session_cookie_for)(other_user),
    )
    for sock in (owners, others):
        assert (await sock.connect())[0]
        await sock.recv()
    # A model save (what Django's admin does): the post_save signal sends user.revoked at once.
    owner.is_active = False
    await sync_to_async(owner.save)()
    assert await closed_with(owners.comm, timeout=1) == 4401
    # A bare UPDATE sends nothing: the periodic re-check finds it.
    await User.objects.filter(pk=other_user.pk).aupdate(is_active=False)
    assert await closed_with(others.comm, timeout=3) == 4401


@pytest.mark.django_db(transaction=True)
async def test_admin_demoted_while_watching_the_board_loses_it(admin_user):
    # The superuser demotes a staff member (staff cannot demote a superuser: tests/test_roles.py).
    boss, admin_user = admin_user, await sync_to_async(make_user)("watcher", is_staff=True)
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()
    boss_client = await sync_to_async(_client)(boss)
    response = await sync_to_async(boss_client.post)(f"/board/users/{admin_user.pk}/", {"action": "demote"})
    assert response.status_code == 302
    assert await closed_with(sock.comm, timeout=2) == 4403
    assert not (await User.objects.aget(pk=admin_user.pk)).is_staff
    demoted = await sync_to_async(_client)(admin_user)
    assert (await sync_to_async(demoted.get)("/board/")).status_code == 404
    assert await BoardSocket(await sync_to_async(session_cookie_for)(admin_user)).connect() == (False, 4403)
