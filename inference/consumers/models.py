"""A rig's model-management socket (staff only): pull progress and model changes for its admin page."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from inference import events
from inference.board import model_admin
from inference.errors import NotFound
from rigdash.ws import CLOSE_NOT_FOUND, StaffConsumer


class RigModelsConsumer(StaffConsumer):
    """A rig's model-management events for its admin page (staff only). Server -> browser frames:
    ``pull.progress``, ``pull.end``, ``models.changed``; actions go through the page's HTTP API."""

    async def connect(self) -> None:
        user = await self.staff_user_or_close(refused=CLOSE_NOT_FOUND)  # others: as if the route did not exist
        if user is None:
            return
        try:
            rig = await database_sync_to_async(model_admin.rig_get_for_admin)(
                user, self.scope["url_route"]["kwargs"]["rig_id"]
            )
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)  # ordinary users: as if the route did not exist
            return
        await self.join(events.rig_models_group(rig.pk))
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        await self.send_json(
            {"type": "error", "code": "read_only", "message": "This socket only reports model events.", "request": None}
        )

    # Channel-layer events (built in inference/events.py), one handler each.
    async def models_pull_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "pull.progress"})

    async def models_pull_end(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "pull.end"})

    async def models_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "models.changed"})
