"""What every RigDash websocket consumer shares: authorise before accept, one group, leave it on close."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class GroupJsonConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None

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
