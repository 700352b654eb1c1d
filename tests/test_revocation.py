"""Losing rights closes every socket of the user within seconds: deactivation (which also cancels their turns),
demotion, logging out and a password change (the socket's session no longer logs them in)."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from inference.board import actions
from inference.models import ChatSession, Rig, Turn
from monitoring import events as monitoring_events
from tests.adminkit import closed_with, make_user
from tests.wsclient import ChatSocket, Socket

pytestmark = pytest.mark.django_db(transaction=True)
WITHIN_S = 5.0  # the periodic re-check runs every 3 s (rigdash/ws.py); a signalled change is at once


def _login(user: User) -> tuple[Client, str]:
    client = Client()
    client.force_login(user)
    return client, str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def _idle_session(owner: User) -> ChatSession:
    rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
    return ChatSession.objects.create(owner=owner, rig=rig, model_name="m")


async def _open(path: str, cookie: str) -> Socket:
    sock = Socket(path, cookie)
    assert (await sock.connect())[0]
    return sock


async def test_deactivation_closes_every_socket_and_cancels_the_users_turns(owner, admin_user):
    session = await sync_to_async(_idle_session)(owner)
    queued = await Turn.objects.acreate(session=session, user_text="waiting")
    running = await Turn.objects.acreate(session=session, user_text="going", status=Turn.Status.DECODING)
    _, cookie = await sync_to_async(_login)(owner)
    chat = ChatSocket(session.pk, cookie)
    assert (await chat.connect())[0]
    monitor = await _open("/ws/monitoring/", cookie)
    await sync_to_async(actions.user_set_active)(actor=admin_user, user=owner, active=False)
    assert await closed_with(chat.comm, timeout=WITHIN_S) == 4401
    assert await closed_with(monitor.comm, timeout=WITHIN_S) == 4401
    assert (await Turn.objects.aget(pk=queued.pk)).status == Turn.Status.CANCELLED
    assert (await Turn.objects.aget(pk=running.pk)).cancel_requested


async def test_deactivation_in_django_admin_cancels_the_users_turns_too(owner):
    session = await sync_to_async(_idle_session)(owner)
    queued = await Turn.objects.acreate(session=session, user_text="waiting")
    owner.is_active = False
    await sync_to_async(owner.save)()
    assert (await Turn.objects.aget(pk=queued.pk)).status == Turn.Status.CANCELLED


async def test_logging_out_closes_the_sockets_opened_with_that_session(owner):
    session = await sync_to_async(_idle_session)(owner)
    client, cookie = await sync_to_async(_login)(owner)
    _, other_cookie = await sync_to_async(_login)(owner)  # another browser: stays logged in
    chat = ChatSocket(session.pk, cookie)
    assert (await chat.connect())[0]
    other = ChatSocket(session.pk, other_cookie)
    assert (await other.connect())[0]
    started = time.monotonic()
    await sync_to_async(client.post)("/logout/")
    assert await closed_with(chat.comm, timeout=WITHIN_S) == 4401
    assert time.monotonic() - started < WITHIN_S
    assert await closed_with(other.comm, timeout=1.0) is None


async def test_a_password_change_closes_every_socket_of_the_user(owner):
    session = await sync_to_async(_idle_session)(owner)
    _, cookie = await sync_to_async(_login)(owner)
    chat = ChatSocket(session.pk, cookie)
    assert (await chat.connect())[0]
    monitor = await _open("/ws/monitoring/", cookie)

    def change() -> None:
        owner.set_password("a-brand-new-pass-99")
        owner.save()

    await sync_to_async(change)()
    assert await closed_with(chat.comm, timeout=WITHIN_S) == 4401
    assert await closed_with(monitor.comm, timeout=WITHIN_S) == 4401


async def test_a_demoted_admin_stops_seeing_other_users_names_on_the_monitoring_socket(admin_user):
    watcher = await sync_to_async(make_user)("watcher", is_staff=True)
    rig = await Rig.objects.acreate(name="mon", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.mon")
    _, cookie = await sync_to_async(_login)(watcher)
    monitor = await _open(f"/ws/monitoring/rigs/{rig.pk}/", cookie)

    async def sample_names(ts: float) -> list[str]:
        sample = {"ts": ts, "series": {}, "detail": {"turns": [{"user": "someone-else"}]}}
        await sync_to_async(monitoring_events.rig_sample_sync)(rig_id=rig.pk, sample=sample)
        frame = await monitor.recv_until(lambda f: f.get("type") == "rig.sample" and f["sample"]["ts"] == ts, 10)
        return [turn["user"] for turn in frame["sample"]["detail"]["turns"]]

    assert await sample_names(1.0) == ["someone-else"]
    await sync_to_async(actions.user_set_staff)(actor=admin_user, user=watcher, staff=False)
    await asyncio.sleep(0.5)  # the revocation event's re-check
    assert await sample_names(2.0) == ["another user"]
