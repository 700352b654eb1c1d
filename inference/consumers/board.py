"""The admin board's websocket (staff only; refused before accept otherwise).

``/ws/board/``: a ``board.snapshot`` frame with every active and recent turn and the running sweeps, then ``turn``
(a row), ``progress`` (a running turn's tokens, tokens/s, context), ``queue`` (queue positions) and ``sweep`` (a
decode sweep's state) frames. Browser -> server:
``turn.cancel {turn}``, ``board.resync``. Errors: ``error {code, message}``.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from inference import events
from inference.board import actions
from inference.errors import InvalidInput
from inference.turns import board_rows, sweep_rows
from rigdash.ws import StaffConsumer, parse_frame, shared_frame


class BoardConsumer(StaffConsumer):
    # Each handler below only sends a frame built from the event (rigdash/ws.py, ``direct_events``).
    direct_events = frozenset({"board.turn", "board.progress", "board.queue", "board.sweep"})

    async def connect(self) -> None:
        if await self.staff_user_or_close() is None:
            return
        await self.join(events.BOARD_GROUP)
        await self.accept()
        await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        rows = await database_sync_to_async(board_rows.board_rows)()
        rigs = await database_sync_to_async(board_rows.rigs_summary)()
        sweeps = await database_sync_to_async(sweep_rows.sweeps_running)()
        await self.send_json({"type": "board.snapshot", "turns": rows, "rigs": rigs, "sweeps": sweeps})

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
                turn = await database_sync_to_async(actions.admin_turn_cancel)(
                    actor=self.scope["user"], turn_id=content.get("turn")
                )
                await self.send_json({"type": "cancel.accepted", "turn": turn.pk, "status": turn.status})
            elif kind == "board.resync":
                await self._send_snapshot()
            else:
                await self._error("unknown_type", f"Unknown frame type {kind!r}.")
        except InvalidInput as exc:
            await self._error(exc.code, exc.message, turn=content.get("turn"))

    async def _error(self, code: str, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})

    # Channel-layer events (built in inference/events.py), one handler each. Every socket here is staff's and gets
    # the same frame of an event, so it is serialised once per event in this process.
    async def board_turn(self, event: dict[str, Any]) -> None:
        await self.send(text_data=shared_frame(event, lambda: {"type": "turn", "turn": event["turn"]}))

    async def board_progress(self, event: dict[str, Any]) -> None:
        await self.send(text_data=shared_frame(event, lambda: {**event, "type": "progress"}))

    async def board_queue(self, event: dict[str, Any]) -> None:
        frame = shared_frame(event, lambda: {"type": "queue", "rig": event["rig"], "positions": event["positions"],
                                             "reasons": event.get("reasons", {})})  # fmt: skip
        await self.send(text_data=frame)

    async def board_sweep(self, event: dict[str, Any]) -> None:
        await self.send(text_data=shared_frame(event, lambda: {"type": "sweep", "sweep": event["sweep"]}))
