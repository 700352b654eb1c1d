"""Dashboard websockets: a rig's samples (``/ws/monitoring/rigs/<id>/``) or every rig's (``/ws/monitoring/``), and a
decode sweep's progress (``/ws/monitoring/sweeps/<id>/``, staff only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async

from inference import events as inference_events
from inference.models import Rig
from inference.turns import sweep_rows
from monitoring import events
from monitoring.selectors import redact_users
from rigdash.ws import CLOSE_NOT_FOUND, GroupJsonConsumer, StaffConsumer, shared_frame


class RigMonitorConsumer(GroupJsonConsumer):
    direct_events = frozenset({"rig.sample"})
    overview = False  # the overview's socket (every rig's samples), set on connect

    async def connect(self) -> None:
        if await self.active_user_or_close() is None:
            return
        rig_id = self.scope["url_route"]["kwargs"].get("rig_id")
        self.overview = rig_id is None
        if self.overview:
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
        if self.overview:
            await self.send(text_data=overview_frame(event, is_staff=self.staff_seen))
            return
        # staff_seen, not the scope's user: it is read again with every re-check, so a demoted admin stops seeing
        # other users' names within seconds (rigdash/ws.py).
        user = self.scope["user"]
        await self.send(text_data=sample_frame(event, viewer=user.get_username(), is_staff=self.staff_seen))


def sample_frame(event: dict[str, Any], *, viewer: str, is_staff: bool) -> str:
    """A rig sample's browser frame, serialised once per sample and kind of viewer in this process: staff see
    it whole, every other user with the others' names hidden. A user with no turn in the sample sees what every
    such user sees, so they share one frame: hundreds of dashboards of one rig cost a serialisation a second per
    user running a turn there, not one per dashboard."""
    if is_staff:
        return _frame(event, lambda: event["sample"], "staff")
    turns = (event["sample"].get("detail") or {}).get("turns") or ()
    seen_as = viewer if any(turn.get("user") == viewer for turn in turns) else ""
    return _frame(event, lambda: redact_users(event["sample"], viewer=seen_as, is_staff=False), "user", seen_as)


def overview_frame(event: dict[str, Any], *, is_staff: bool) -> str:
    """A rig sample's frame for the overview, which shows a row per rig (static/rigdash/overview.js): the series,
    the backend's state and the rig agent's, without the slots, turns and the rest of the detail a dashboard draws,
    redacted as ``sample_frame`` is for a user who is not staff. It names no user, so it is built once per sample
    for staff and once for everyone else."""

    def slim() -> dict[str, Any]:
        sample, detail = event["sample"], event["sample"].get("detail") or {}
        kept = {"sources": {"backend": (detail.get("sources") or {}).get("backend", {})}}
        if "agent" in detail:
            kept["agent"] = detail["agent"]
        slim = {"ts": sample.get("ts"), "series": sample.get("series", {}), "detail": kept}
        return redact_users(slim, viewer="", is_staff=is_staff)

    return _frame(event, slim, "overview", is_staff)


def _frame(event: dict[str, Any], sample: Callable[[], dict[str, Any]], *variant: Any) -> str:
    """The sample's frame for one kind of viewer (``variant``), serialised once per sample in this process."""
    return shared_frame(event, lambda: {"type": "rig.sample", "rig": event["rig"], "sample": sample()}, *variant)


class SweepConsumer(StaffConsumer):
    """A sweep's page: ``sweep.snapshot`` (its state and every point so far) once joined, then ``progress`` frames
    (inference/events.py, ``sweep.progress``). Staff only: anyone else is refused (4403), a missing sweep 4404."""

    async def connect(self) -> None:
        if await self.staff_user_or_close() is None:
            return
        sweep_id = int(self.scope["url_route"]["kwargs"]["sweep_id"])
        if await database_sync_to_async(sweep_rows.sweep_get)(sweep_id) is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.join(inference_events.sweep_group(sweep_id))  # before the snapshot: nothing falls between
        await self.accept()
        sweep = await database_sync_to_async(sweep_rows.sweep_get)(sweep_id)
        snapshot = await database_sync_to_async(sweep_rows.sweep_snapshot)(sweep)
        await self.send_json({"type": "sweep.snapshot", "sweep": snapshot})

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "code": "read_only", "message": "This socket only sends progress."})

    async def sweep_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "progress", "sweep": event["sweep"], "points": event["points"]})
