"""What every RigDash websocket consumer shares: authorise before accept, one group, leave it on close."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class ReadOnlySessionMiddleware(SessionMiddleware):  # type: ignore[misc]
    """Channels' SessionMiddleware, without its wrapper around every frame a websocket sends.

    Channels wraps ``send`` to save the session and set its cookie on ``http.response.start``, which a websocket
    never sends; yet for every frame the wrapper read the session's ``modified`` and ``is_empty()`` through a lazy
    proxy: about a sixth of the web loop's CPU while 16 turns streamed to 200 viewers (docs/benchmarks.md). A
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


class GroupJsonConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None
    # Channel-layer event types whose handlers touch no database, only send a frame, and may share the event
    # with other sockets (read it, never change it). Channels runs close_old_connections in its one sync thread
    # before every handler; these skip that hop (34 % of the web's CPU while streaming tokens, under Daphne). And
    # while the socket is idle, rigdash.channel_layer hands them to the handler straight from the layer's reader, once
    # for every socket instead of a task hop per socket (docs/benchmarks.md).
    direct_events: frozenset[str] = frozenset()
    _busy = 0  # handlers running now (this socket's frames, its queued events, its connect and disconnect)
    _direct = False  # registered with a layer that delivers directly

    async def dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type", "")
        self._busy += 1
        try:
            if kind in self.direct_events:
                await self.direct_deliver(message)
            else:
                await super().dispatch(message)
        finally:
            self._busy -= 1
            if self._direct and not kind.startswith("websocket."):
                self.channel_layer.direct_dispatched(self.channel_name)  # from the layer's queue: it may be empty now

    def direct_ready(self, event_type: str) -> bool:
        return not self._busy and event_type in self.direct_events

    async def direct_deliver(self, event: dict[str, Any]) -> None:
        await getattr(self, get_handler_name(event))(event)

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

    async def disconnect(self, code: int) -> None:
        if self._direct:
            self.channel_layer.direct_discard(self.channel_name)
            self._direct = False
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
