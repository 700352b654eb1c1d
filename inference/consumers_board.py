"""The admin board's websocket, and the re-check that closes any socket whose user lost the right to it.

``/ws/board/`` (staff only; refused before accept otherwise): a ``board.snapshot`` frame with every
active and recent turn, then ``turn`` (a row), ``progress`` (a running turn's tokens, tokens/s,
context) and ``queue`` (queue positions) frames. Browser -> server: ``turn.cancel {turn}``,
``board.resync``. Errors: ``error {code, message}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import User

from inference import board, events, services, services_admin

CLOSE_UNAUTHORISED = 4401
CLOSE_FORBIDDEN = 4403
RECHECK_INTERVAL_S = 3.0
_ALLOWED: dict[tuple[str, int], tuple[float, bool]] = {}  # (consumer, user id) -> (checked at, allowed)
# Per event loop: the sockets being re-checked, and the one task that re-checks them all every interval (a task
# per socket woke the web process 80 times a second with 250 sockets open, docs/benchmarks.md).
_WATCHED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[set[RevocableMixin], asyncio.Task[None]]] = (
    weakref.WeakKeyDictionary()
)
log = logging.getLogger(__name__)


async def _recheck_all(sockets: set[RevocableMixin]) -> None:
    while sockets:
        await asyncio.sleep(RECHECK_INTERVAL_S)
        for consumer in list(sockets):
            if consumer not in sockets:
                continue  # closed while an earlier one was checked
            try:
                if not await consumer.recheck_user():
                    sockets.discard(consumer)
            except Exception:
                log.exception("re-checking a socket's user failed")


class RevocableMixin:
    """Re-check the socket's user every few seconds and on ``user.revoked``; close when they lost access.

    A consumer calls ``watch_user()`` after ``accept()`` and ``unwatch_user()`` in ``disconnect()``,
    and overrides ``user_allowed`` (a database check) and ``revoked_close_code``.
    """

    revoked_close_code = CLOSE_UNAUTHORISED
    _user_group: str | None = None
    channel_layer: Any
    channel_name: str
    scope: dict[str, Any]

    @staticmethod
    def user_allowed(user_id: int) -> bool:
        return User.objects.filter(pk=user_id, is_active=True).exists()

    async def watch_user(self) -> None:
        self._user_group = events.user_group(self.scope["user"].pk)
        await self.channel_layer.group_add(self._user_group, self.channel_name)
        loop = asyncio.get_running_loop()
        watched = _WATCHED.get(loop)
        if watched is None or watched[1].done():
            sockets: set[RevocableMixin] = set()
            watched = _WATCHED[loop] = (sockets, loop.create_task(_recheck_all(sockets)))
        watched[0].add(self)

    async def unwatch_user(self) -> None:
        if (watched := _WATCHED.get(asyncio.get_running_loop())) is not None:
            watched[0].discard(self)
        if self._user_group:
            await self.channel_layer.group_discard(self._user_group, self.channel_name)
            self._user_group = None

    async def _allowed(self, user_id: int, *, fresh: bool) -> bool:
        """``user_allowed``, asked at most once per interval per user and kind of socket in this process: a user
        with many tabs, or a server with hundreds of sockets, costs one query per user every few seconds."""
        key = (type(self).__qualname__, user_id)
        cached = _ALLOWED.get(key)
        now = time.monotonic()
        if fresh or cached is None or now - cached[0] >= RECHECK_INTERVAL_S:
            cached = (now, await database_sync_to_async(self.user_allowed)(user_id))
            _ALLOWED[key] = cached
        return cached[1]

    async def recheck_user(self, *, fresh: bool = False) -> bool:
        if await self._allowed(self.scope["user"].pk, fresh=fresh):
            return True
        await self.close(code=self.revoked_close_code)  # type: ignore[attr-defined]
        return False

    async def user_revoked(self, event: dict[str, Any]) -> None:
        await self.recheck_user(fresh=True)  # an admin just changed this user: ask the database now


def parse_frame(text_data: str | None) -> dict[str, Any] | tuple[str, str]:
    """A browser frame as a dict, or (code, message) saying why it is refused."""
    limit = settings.RIGDASH.max_ws_frame_bytes
    if text_data is None:
        return "bad_frame", "Frames must be JSON text."
    if len(text_data.encode("utf-8")) > limit:
        return "frame_too_large", f"Frames are limited to {limit} bytes."
    try:
        content = json.loads(text_data)
    except ValueError:
        return "bad_json", "The frame is not valid JSON."
    if not isinstance(content, dict):
        return "bad_frame", "A frame must be a JSON object with a type."
    return content


def _staff_allowed(user_id: int) -> bool:
    return User.objects.filter(pk=user_id, is_active=True, is_staff=True).exists()


class BoardConsumer(RevocableMixin, AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    revoked_close_code = CLOSE_FORBIDDEN
    joined = False

    @staticmethod
    def user_allowed(user_id: int) -> bool:
        return _staff_allowed(user_id)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        if not await database_sync_to_async(_staff_allowed)(user.pk):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(events.BOARD_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self.watch_user()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        await self.unwatch_user()
        if self.joined:
            await self.channel_layer.group_discard(events.BOARD_GROUP, self.channel_name)

    async def _send_snapshot(self) -> None:
        rows = await database_sync_to_async(board.board_rows)()
        rigs = await database_sync_to_async(board.rigs_summary)()
        await self.send_json({"type": "board.snapshot", "turns": rows, "rigs": rigs})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        content = parse_frame(text_data)
        if isinstance(content, tuple):
            await self._error(*content)
            return
        if not await self.recheck_user():  # an admin demoted a moment ago can do nothing more
            return
        kind = content.get("type")
        try:
            if kind == "turn.cancel":
                turn = await database_sync_to_async(services_admin.admin_turn_cancel)(
                    actor=self.scope["user"], turn_id=content.get("turn")
                )
                await self.send_json({"type": "cancel.accepted", "turn": turn.pk, "status": turn.status})
            elif kind == "board.resync":
                await self._send_snapshot()
            else:
                await self._error("unknown_type", f"Unknown frame type {kind!r}.")
        except services.InvalidInput as exc:
            await self._error(exc.code, exc.message, turn=content.get("turn"))

    async def _error(self, code: str, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})

    # Channel-layer events (built in inference/events.py), one handler each.
    async def board_turn(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "turn", "turn": event["turn"]})

    async def board_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "progress"})

    async def board_queue(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "queue", "rig": event["rig"], "positions": event["positions"]})
