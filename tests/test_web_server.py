"""The real web server (rigdash/webserver.py: uvicorn, as scripts/run starts it) over the network: what the
in-process websocket tests (tests/wsclient.py, Channels' communicator) cannot see. A websocket client of the
`websockets` package, the library uvicorn itself serves websockets with. And its quiet main loop, in-process."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from rigdash import webserver
from rigdash.env import WS_MAX_BYTES
from tests.conftest import LOG_DIR, session_cookie_for, wait_until

over_the_network = pytest.mark.django_db(transaction=True)


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


@over_the_network
async def test_a_page_of_another_site_cannot_open_a_socket(web_url, chat_session, owner):
    with pytest.raises(InvalidStatus) as refused:
        await _chat_socket(web_url, chat_session, owner, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    async with await _chat_socket(web_url, chat_session, owner) as ws:  # the same socket from RigDash's own origin
        assert (await _frame(ws))["type"] == "session.snapshot"


@over_the_network
async def test_the_log_keeps_refusals_but_not_every_connection(web_url, chat_session, owner):
    """uvicorn logs each websocket's accept, open and close at INFO (three lines a page; Daphne logged none): the
    web server drops those, and keeps a refused socket's line."""
    log_path = LOG_DIR / "web.log"
    start = log_path.stat().st_size
    async with await _chat_socket(web_url, chat_session, owner) as ws:
        assert (await _frame(ws))["type"] == "session.snapshot"
    with pytest.raises(InvalidStatus):
        await _chat_socket(web_url, chat_session, owner, origin="http://evil.example")
    path = f"/ws/chat/{chat_session.pk}/"

    def written() -> str:
        with log_path.open(encoding="utf-8", errors="replace") as log:
            log.seek(start)
            return log.read()

    logged = await sync_to_async(wait_until)(
        lambda: (text := written()) and f'"WebSocket {path}" 403' in text and text, timeout_s=10, what="the 403 line"
    )
    assert "[accepted]" not in logged and "connection open" not in logged and "connection closed" not in logged


@over_the_network
async def test_another_users_chat_socket_is_closed_on_the_real_server(web_url, chat_session, other_user):
    with pytest.raises((InvalidStatus, ConnectionClosedError)):  # refused before accept: 403, or closed at once
        ws = await _chat_socket(web_url, chat_session, other_user)
        await _frame(ws)


@over_the_network
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


@over_the_network
def test_answers_carry_a_date_and_do_not_name_the_server(web_url):
    answer = httpx.get(f"{web_url}/static/rigdash/app.css", timeout=10)
    assert answer.status_code == 200
    assert "date" in answer.headers and "server" not in answer.headers


@over_the_network
def test_the_favicon_a_browser_asks_for_is_rigdashs_icon(web_url):
    """Pages that name no icon (Django's admin) make the browser ask for /favicon.ico: it must not be a 404."""
    answer = httpx.get(f"{web_url}/favicon.ico", timeout=10, follow_redirects=True)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    assert answer.url.path.endswith("/rigdash/favicon.svg") and b"<svg" in answer.content
    assert httpx.post(f"{web_url}/favicon.ico", timeout=10).status_code in (403, 405)  # CSRF first, then the view


async def test_the_quiet_main_loop_refreshes_the_date_at_every_tick(monkeypatch):
    """uvicorn refreshes the Date header when its tick counter is a multiple of 10 (every tenth 0.1 s tick); the
    quiet loop ticks ten times less often, so it must refresh at every tick."""
    stamps: list[float] = []
    monkeypatch.setattr(webserver, "TICK_S", 0.05)
    monkeypatch.setattr("uvicorn.server.formatdate", lambda t, usegmt: stamps.append(t) or "now")
    server = webserver.QuietServer(webserver.config("127.0.0.1", 0))
    loop = asyncio.create_task(server.main_loop())
    await asyncio.sleep(0.5)
    server.should_exit = True
    await asyncio.wait_for(loop, 2)
    assert len(stamps) >= 5, stamps  # about 10 ticks in 0.5 s; refreshing every tenth tick gives 1


async def test_the_quiet_main_loop_stops_at_once_on_a_signal(monkeypatch):
    monkeypatch.setattr(webserver, "TICK_S", 30.0)
    server = webserver.QuietServer(webserver.config("127.0.0.1", 0))
    loop = asyncio.create_task(server.main_loop())
    await asyncio.sleep(0.1)
    assert not loop.done()
    server.handle_exit(signal.SIGTERM, None)  # what the SIGTERM handler calls (not raised here: pytest would stop)
    await asyncio.wait_for(loop, 1)  # not at the next 30 s tick
