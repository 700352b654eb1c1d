"""What every RigDash websocket consumer shares: authorise before accept, one group, leave it on close, the frame
parser, the close codes, and the re-check that closes a socket whose user lost the right to it.

Close codes: 4401 not logged in (or deactivated), 4403 logged in without the right (e.g. demoted from staff), 4404
the object does not exist or is not the user's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from channels.auth import AuthMiddleware
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware
from django.conf import settings

from rigdash import fastjson, strictjson
from rigdash.access import Rights, is_staff, rights_now, staff_id_now
from rigdash.groups import user_group

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4408  # the socket's outbox overflowed (a client reading slower than events come): reconnect, resync
RECHECK_INTERVAL_S = 3.0
log = logging.getLogger(__name__)


def parse_frame(text_data: str | None) -> dict[str, Any] | tuple[str, str]:
    """A browser frame as a dict, or (code, message) saying why it is refused."""
    limit = settings.RIGDASH.max_ws_frame_bytes
    if text_data is None:
        return "bad_frame", "Frames must be JSON text."
    if len(text_data.encode("utf-8")) > limit:
        return "frame_too_large", f"Frames are limited to {limit} bytes."
    try:
        content = strictjson.loads(text_data)
    except ValueError:
        return "bad_json", "The frame is not valid JSON (numbers must be finite, nesting shallow)."
    if not isinstance(content, dict):
        return "bad_frame", "A frame must be a JSON object with a type."
    return content


_slow_sends: set[asyncio.Task[Any]] = set()  # referenced until done

# (id(event), variant) -> (event, frame). The event is held with its frame, so its id cannot be reused meanwhile.
_shared_frames: dict[tuple[Any, ...], tuple[dict[str, Any], str]] = {}
_SHARED_FRAMES_KEPT = 512


def shared_frame(event: dict[str, Any], build: Callable[[], dict[str, Any]], *variant: Any) -> str:
    """The frame ``build`` makes of a channel-layer event, serialised once in this process for every socket handed
    that same event (rigdash.channel_layer hands one event object to each member socket) and the same ``variant``
    (what else the frame depends on: a kind of viewer, say)."""
    key = (id(event), *variant)
    if (hit := _shared_frames.get(key)) is not None and hit[0] is event:
        return hit[1]
    frame = fastjson.dumps(build()).decode()
    if len(_shared_frames) >= _SHARED_FRAMES_KEPT:
        _shared_frames.clear()  # events come and go in order: nothing this old is handed out again
    _shared_frames[key] = (event, frame)
    return frame


async def _finish(coro: Any, waiting_on: Any) -> None:
    """Drive ``coro`` on from the future it is waiting on (it was started by hand in ``direct_deliver``)."""
    await _Resume(coro, waiting_on)


class _Resume:
    def __init__(self, coro: Any, waiting_on: Any) -> None:
        self.coro, self.waiting_on = coro, waiting_on

    def __await__(self) -> Any:
        value = self.waiting_on
        while True:
            try:
                sent = yield value
            except BaseException as exc:  # cancelled: pass it into the coroutine
                try:
                    value = self.coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                value = self.coro.send(sent)
            except StopIteration:
                return


class FrameRate:
    """A token bucket per user in this process: ``rate`` frames a second, bursts of ``2 * rate``."""

    def __init__(self) -> None:
        self._buckets: dict[int, tuple[float, float]] = {}  # user id -> (tokens, at)

    def allow(self, user_id: int, now: float | None = None) -> bool:
        rate = float(settings.WS_FRAMES_PER_S)
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(user_id, (2 * rate, now))
        tokens = min(2 * rate, tokens + (now - at) * rate)
        if len(self._buckets) > 10_000:  # users long gone: their buckets are full again anyway
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
        if tokens < 1:
            self._buckets[user_id] = (tokens, now)
            return False
        self._buckets[user_id] = (tokens - 1, now)
        return True


frame_rate = FrameRate()
RATE_LIMITED = ("rate_limited", "Too many messages at once: this one was dropped. Slow down and try again.")


class ReadOnlySessionMiddleware(SessionMiddleware):  # type: ignore[misc]
    """Channels' SessionMiddleware, without its wrapper around every frame a websocket sends.

    Channels wraps ``send`` to save the session and set its cookie on ``http.response.start``, which a websocket
    never sends; yet for every frame the wrapper reads the session's ``modified`` and ``is_empty()`` through a lazy
    proxy, a large share of the web loop's CPU while streaming. A
    socket still gets its session (and so its user) from the cookie; RigDash's consumers never write it.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") != "websocket":
            return await super().__call__(scope, receive, send)
        wrapper = InstanceSessionWrapper(scope, send)
        await wrapper.resolve_session()
        return await self.inner(wrapper.scope, receive, send)


def auth_middleware_stack(inner: Any) -> Any:
    """Channels' AuthMiddlewareStack with ReadOnlySessionMiddleware: the user of a websocket from its session cookie."""
    return CookieMiddleware(ReadOnlySessionMiddleware(AuthMiddleware(inner)))


# (user id, session key) -> (checked at, rights): one read per user and session every interval in this process.
_RIGHTS: dict[tuple[int, str | None], tuple[float, Rights]] = {}
# Per event loop: the sockets being re-checked, and the one task that re-checks them all every interval (a task
# per socket would wake the web process for every socket every interval).
_WATCHED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[set[RevocableMixin], asyncio.Task[None]]] = (
    weakref.WeakKeyDictionary()
)


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

    Access is lost when the user is deactivated, when the session the socket was opened with ends (logged out,
    expired, flushed) or no longer matches the user's password (changed since: Django's session auth hash), and,
    for a staff socket, when the user is demoted. ``GroupJsonConsumer`` watches every socket from its ``accept()``
    to its ``disconnect()``; a consumer overrides ``rights_allow`` and ``revoked_close_code``. ``staff_seen`` holds
    the user's staff flag as last read, for consumers that show staff more.
    """

    revoked_close_code = CLOSE_UNAUTHENTICATED
    _user_group: str | None = None
    staff_seen = False
    channel_layer: Any
    channel_name: str
    scope: dict[str, Any]

    @staticmethod
    def rights_allow(rights: Rights) -> bool:
        return rights.active and rights.session_ok

    async def watch_user(self) -> None:
        self._user_group = user_group(self.scope["user"].pk)
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

    async def _rights(self, user_id: int, *, fresh: bool) -> Rights:
        """``rights_now``, asked at most once per interval per user and session in this process: a user with many
        tabs, or a server with hundreds of sockets, costs a query or two per session every few seconds."""
        session = self.scope.get("session")
        key = (user_id, getattr(session, "session_key", None))
        cached = _RIGHTS.get(key)
        now = time.monotonic()
        if fresh or cached is None or now - cached[0] >= RECHECK_INTERVAL_S:
            cached = (now, await database_sync_to_async(rights_now)(user_id, key[1]))
            if len(_RIGHTS) > 10_000:  # sessions long closed: re-read when seen again
                for stale in [k for k, (at, _) in _RIGHTS.items() if now - at >= RECHECK_INTERVAL_S]:
                    del _RIGHTS[stale]
            _RIGHTS[key] = cached
        return cached[1]

    async def recheck_user(self, *, fresh: bool = False) -> bool:
        rights = await self._rights(self.scope["user"].pk, fresh=fresh)
        self.staff_seen = rights.active and rights.staff
        if self.rights_allow(rights):
            return True
        await self.close(code=self.revoked_close_code)  # type: ignore[attr-defined]
        return False

    async def user_revoked(self, event: dict[str, Any]) -> None:
        await self.recheck_user(fresh=True)  # an admin just changed this user: ask the database now


class GroupJsonConsumer(RevocableMixin, AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """A socket in one group, whose user is re-checked while it is open (``RevocableMixin``)."""

    group: str | None = None
    # Channel-layer event types whose handlers touch no database, only send a frame, and may share the event
    # with other sockets (read it, never change it). Channels runs close_old_connections in its one sync thread
    # before every handler; these skip that hop. And while the socket is idle, rigdash.channel_layer hands them to
    # the handler straight from the layer's reader, once for every socket instead of a task hop per socket.
    direct_events: frozenset[str] = frozenset()
    _busy = 0  # handlers running now (this socket's frames, its queued events, its connect and disconnect)
    _direct = False  # registered with a layer that delivers directly

    async def dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type", "")
        self._busy += 1
        try:
            if kind in self.direct_events:
                # From this socket's queue: the handler is awaited here, so a send that waits (a client that does
                # not read) holds the queue, which the layer bounds (WS_OUTBOX_MAX). Finished on a task of its own,
                # as direct_deliver does for the layer's reader, every waiting event would be a task: no bound.
                await getattr(self, get_handler_name(message))(message)
            else:
                await super().dispatch(message)
        finally:
            self._busy -= 1
            if self._direct and not kind.startswith("websocket."):
                self.channel_layer.direct_dispatched(self.channel_name)  # from the layer's queue: it may be empty now

    def direct_ready(self, event_type: str) -> bool:
        return not self._busy and event_type in self.direct_events

    async def direct_deliver(self, event: dict[str, Any]) -> None:
        """Run the handler from the layer's reader. A handler whose send would wait (the client reads slower than
        events come: the web server's write buffer is full) finishes on a task of its own, and the socket counts as
        busy meanwhile, so its later events go to its bounded queue (``outbox_overflow``) and the reader goes on
        to the other sockets at once."""
        coro = getattr(self, get_handler_name(event))(event)
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            return
        except BaseException:
            coro.close()
            raise
        self._busy += 1
        task = asyncio.get_running_loop().create_task(_finish(coro, waiting_on))
        _slow_sends.add(task)
        task.add_done_callback(self._slow_send_done)

    def _slow_send_done(self, task: asyncio.Task[None]) -> None:
        _slow_sends.discard(task)
        self._busy -= 1
        if not task.cancelled() and task.exception() is not None:
            log.warning("a slow socket's send failed: %r", task.exception())
        if self._direct:
            self.channel_layer.direct_dispatched(self.channel_name)

    def outbox_overflow(self) -> None:
        """The layer dropped this socket's waiting events (more than ``WS_OUTBOX_MAX``): close it (4408); the page
        reconnects and gets the session's snapshot and each running reply's text so far."""
        if self._overflowed:
            return
        self._overflowed = True
        log.warning("socket %s closed: its outbox overflowed (a client reading slower than events come)", self)
        task = asyncio.get_running_loop().create_task(self.close(code=CLOSE_TOO_SLOW))
        _slow_sends.add(task)
        task.add_done_callback(_slow_sends.discard)

    _overflowed = False

    _limited_told_at = 0.0

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """Every frame from the browser passes the per-user rate limit first (``WS_FRAMES_PER_S``, all the user's
        sockets in this process together). A frame over it is not handled; the ``RATE_LIMITED`` error frame says
        so, at most once a second per socket (a flood gets no flood of answers)."""
        user = self.scope.get("user")
        if frame_rate.allow(getattr(user, "pk", 0) or 0):
            await super().websocket_receive(message)
            return
        now = time.monotonic()
        if now - self._limited_told_at >= 1.0:
            self._limited_told_at = now
            code, text = RATE_LIMITED
            await self.send_json({"type": "error", "code": code, "message": text, "request": None})

    async def active_user_or_close(self) -> Any | None:
        """The logged-in, active user of this socket; otherwise refuse the handshake (4401) and return None."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return None
        return user

    async def join(self, group: str) -> None:
        """Join the socket's group. Called from ``connect``, which counts as busy: events published before
        it returns wait in the queue, after whatever it sends (the snapshot)."""
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        if self.direct_events and (direct_add := getattr(self.channel_layer, "direct_add", None)) is not None:
            direct_add(self.channel_name, self)  # only rigdash.channel_layer's layer has it
            self._direct = True

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        self.staff_seen = is_staff(self.scope.get("user"))
        await self.watch_user()  # a user who loses the right to this socket is closed out within seconds

    async def disconnect(self, code: int) -> None:
        await self.unwatch_user()
        if self._direct:
            self.channel_layer.direct_discard(self.channel_name)
            self._direct = False
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)


class StaffConsumer(GroupJsonConsumer):
    """A socket for staff only: closed (4403) within seconds of its user being demoted or deactivated."""

    revoked_close_code = CLOSE_FORBIDDEN

    @staticmethod
    def rights_allow(rights: Rights) -> bool:
        return rights.active and rights.staff and rights.session_ok

    async def staff_user_or_close(self, *, refused: int = CLOSE_FORBIDDEN) -> Any | None:
        """The socket's user if they are staff now (read from the database); otherwise refuse the handshake with
        4401 (not logged in) or ``refused`` and return None."""
        user = await self.active_user_or_close()
        if user is None:
            return None
        if not await database_sync_to_async(staff_id_now)(user.pk):
            await self.close(code=refused)
            return None
        return user
