"""Dashboard websockets: a rig's samples (``/ws/monitoring/rigs/<id>/``) or every rig's (``/ws/monitoring/``)."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from inference.models import Rig
from monitoring import events
from monitoring.selectors import redact_users
from rigdash.ws import CLOSE_NOT_FOUND, GroupJsonConsumer


class RigMonitorConsumer(GroupJsonConsumer):
    no_database_events = frozenset({"rig.sample"})

    async def connect(self) -> None:
        if await self.active_user_or_close() is None:
            return
        rig_id = self.scope["url_route"]["kwargs"].get("rig_id")
        if rig_id is None:
            await self.join(events.OVERVIEW_GROUP)
        elif await database_sync_to_async(Rig.objects.filter(pk=rig_id, enabled=True).exists)():
            await self.join(events.rig_group(int(rig_id)))
        else:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.accept()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "code": "read_only", "message": "This socket only sends samples."})

    async def rig_sample(self, event: dict[str, Any]) -> None:
        user = self.scope["user"]
        sample = redact_users(event["sample"], viewer=user.get_username(), is_staff=user.is_staff)
        await self.send_json({"type": "rig.sample", "rig": event["rig"], "sample": sample})
