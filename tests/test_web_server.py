"""The real web server (uvicorn with rigdash.launcher.web_command's flags) over the network: what the in-process
websocket tests (tests/wsclient.py, Channels' communicator) cannot see. A websocket client of the `websockets`
package, the library uvicorn itself serves websockets with."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from rigdash.env import WS_MAX_BYTES
from tests.conftest import session_cookie_for

pytestmark = pytest.mark.django_db(transaction=True)


async def _chat_socket(web_url: str, session: Any, user: Any, *, origin: str | None = None) -> ClientConnection:
    cookie = await sync_to_async(session_cookie_for)(user)
    return await connect(
        f"{web_url.replace('http://', 'ws://', 1)}/ws/chat/{session.pk}/",
        origin=origin or web_url,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"},
        max_size=None,
        open_timeout=15,
    )


async def _frame(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await ws.recv(decode=True))
    return frame


async def test_a_page_of_another_site_cannot_open_a_socket(web_url, chat_session, owner):
    with pytest.raises(InvalidStatus) as refused:
        await _chat_socket(web_url, chat_session, owner, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    async with await _chat_socket(web_url, chat_session, owner) as ws:  # the same socket from RigDash's own origin
        assert (await _frame(ws))["type"] == "session.snapshot"


async def test_another_users_chat_socket_is_closed_on_the_real_server(web_url, chat_session, other_user):
    with pytest.raises((InvalidStatus, ConnectionClosedError)):  # refused before accept: 403, or closed at once
        ws = await _chat_socket(web_url, chat_session, other_user)
        await _frame(ws)


async def test_an_oversized_message_closes_only_its_socket(web_url, chat_session, owner):
    """Over RigDash's frame limit: an error frame, the socket stays. Over the server's bound (WS_MAX_BYTES, which
    Daphne did not have): the server closes that socket with 1009 before reading the rest into memory, and serves
    the next one."""
    async with await _chat_socket(web_url, chat_session, owner) as ws:
        await _frame(ws)  # the snapshot
        await ws.send(json.dumps({"type": "turn.send", "text": "a" * (settings.RIGDASH.max_ws_frame_bytes + 10)}))
        reply = await _frame(ws)
        assert reply["type"] == "error" and reply["code"] == "frame_too_large", reply
        await ws.send("x" * (WS_MAX_BYTES + 1))
        with pytest.raises(ConnectionClosedError) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with await _chat_socket(web_url, chat_session, owner) as ws:
        assert (await _frame(ws))["type"] == "session.snapshot"
