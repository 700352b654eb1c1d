"""Dashboard websockets: a rig's samples (``/ws/monitoring/rigs/<id>/``) or every rig's (``/ws/monitoring/``)."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from inference.models import Rig
from monitoring import events
from monitoring.selectors import redact_users


class RigMonitorConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=4401)
            return
        rig_id = self.scope["url_route"]["kwargs"].get("rig_id")
        if rig_id is None:
            self.group = events.OVERVIEW_GROUP
        elif await database_sync_to_async(Rig.objects.filter(pk=rig_id, enabled=True).exists)():
            self.group = events.rig_group(int(rig_id))
        else:
            await self.close(code=4404)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "code": "read_only", "message": "This socket only sends samples."})

    async def rig_sample(self, event: dict[str, Any]) -> None:
        user = self.scope["user"]
        sample = redact_users(event["sample"], viewer=user.get_username(), is_staff=user.is_staff)
        await self.send_json({"type": "rig.sample", "rig": event["rig"], "sample": sample})
