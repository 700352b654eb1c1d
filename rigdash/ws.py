"""What every RigDash websocket consumer shares: authorise before accept, one group, leave it on close."""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class GroupJsonConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None
    # Channel-layer event types whose handlers touch no database. Channels runs close_old_connections in its
    # one sync thread before every handler; frequent events skip that hop (34 % of Daphne's CPU while
    # streaming tokens, docs/benchmarks.md).
    no_database_events: frozenset[str] = frozenset()

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") in self.no_database_events:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def active_user_or_close(self) -> Any | None:
        """The logged-in, active user of this socket; otherwise refuse the handshake (4401) and return None."""
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return None
        return user

    async def join(self, group: str) -> None:
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
