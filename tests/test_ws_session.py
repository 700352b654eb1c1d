"""rigdash.ws.ReadOnlySessionMiddleware: a websocket gets its session (its user) from the cookie, and its frames go
out through the server's own ``send``, without Channels' session wrapper; HTTP keeps the wrapper, which saves the
session and sets its cookie."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.sessions import CookieMiddleware
from django.conf import settings

from rigdash.ws import ReadOnlySessionMiddleware
from tests.conftest import session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)


async def _through_middleware(scope_type: str, cookie: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen["send"] = send
        seen["user_id"] = await database_sync_to_async(lambda: scope["session"].get("_auth_user_id"))()

    async def server_send(message: dict[str, Any]) -> None:
        seen.setdefault("sent", []).append(message)

    scope = {"type": scope_type, "headers": [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())]}
    await CookieMiddleware(ReadOnlySessionMiddleware(inner))(scope, None, server_send)
    seen["server_send"] = server_send
    return seen


async def test_a_websocket_reads_its_session_and_sends_through_the_servers_own_send(owner):
    seen = await _through_middleware("websocket", await sync_to_async(session_cookie_for)(owner))
    assert seen["user_id"] == str(owner.pk)
    assert seen["send"] is seen["server_send"]  # no wrapper reading the session at every frame


async def test_http_keeps_channels_session_wrapper(owner):
    seen = await _through_middleware("http", await sync_to_async(session_cookie_for)(owner))
    assert seen["user_id"] == str(owner.pk)
    assert seen["send"] is not seen["server_send"]  # Channels' wrapper, which saves a modified session
