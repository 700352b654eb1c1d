"""The chat websocket: authorise, then translate browser frames to services and events to frames.

Browser -> server frames (JSON): ``turn.send {text, params?}``, ``turn.cancel {turn}``, ``turn.resync {turn}``.
Server -> browser frames: ``session.snapshot``, ``turn.snapshot``, ``turn.queued``, ``turn.state``,
``token``, ``turn.end``, ``error {code, message}``. See docs/streaming.md.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from inference import events
from inference.errors import InvalidInput, NotFound, QueueUnavailable
from inference.queue.ratelimits import RateLimited
from inference.turns import lifecycle, selectors, submit_queue
from rigdash.ws import CLOSE_NOT_FOUND, GroupJsonConsumer, parse_frame


class ChatConsumer(GroupJsonConsumer):
    session_id: int
    # Every chat event: tokens come up to 30 a second for every socket, and at a burst of submits each one
    # re-announces the queue positions to every waiting page. Their handlers only send a frame.
    direct_events = frozenset({"chat.token", "chat.turn_queued", "chat.turn_state", "chat.turn_end"})

    async def connect(self) -> None:
        user = await self.active_user_or_close()
        if user is None:
            return
        try:
            session = await database_sync_to_async(selectors.session_get_for)(
                user, int(self.scope["url_route"]["kwargs"]["session_id"])
            )
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.session_id = session.pk
        # Join the group before reading the snapshot: a batch published in between is then both in
        # the snapshot and delivered live, and the browser drops it by seq; none can fall in a gap.
        await self.join(events.session_group(session.pk))
        await self.accept()
        history = await database_sync_to_async(selectors.session_history)(session)
        await self.send_json({"type": "session.snapshot", "session": session.pk, "turns": history})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        content = parse_frame(text_data)
        if isinstance(content, tuple):
            await self._error(*content)
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        handlers = {"turn.send": self._turn_send, "turn.cancel": self._turn_cancel, "turn.resync": self._turn_resync}
        handler = handlers.get(content.get("type", ""))
        if handler is None:
            await self._error("unknown_type", f"Unknown frame type {content.get('type')!r}.")
            return
        try:
            await handler(content)
        except NotFound:
            await self._error("not_found", "No such turn in this session.")
        except RateLimited as exc:  # the frame says when to send again
            await self.send_json({"type": "error", "code": exc.code, "message": exc.message,
                                  "request": content.get("client_id"), "retry_after_s": exc.retry_after_s})  # fmt: skip
        except (InvalidInput, QueueUnavailable) as exc:  # the latter's turn is stored and waits
            await self._error(exc.code, exc.message, request=content.get("client_id"))

    async def _turn_send(self, content: dict[str, Any]) -> None:
        # Stored with any other socket's submits waiting at the same moment (inference/turns/submit_queue.py).
        await submit_queue.submit(
            user=self.scope["user"], session_id=self.session_id, text=content.get("text"), params=content.get("params")
        )

    async def _owned_turn(self, content: dict[str, Any]) -> Any:
        turn = await database_sync_to_async(selectors.turn_get_for)(self.scope["user"], content.get("turn"))
        if turn.session_id != self.session_id:
            raise NotFound("turn")
        return turn

    async def _turn_cancel(self, content: dict[str, Any]) -> None:
        turn = await self._owned_turn(content)
        await database_sync_to_async(lifecycle.turn_cancel)(turn=turn)

    async def _turn_resync(self, content: dict[str, Any]) -> None:
        turn = await self._owned_turn(content)
        snapshot = await database_sync_to_async(selectors.turn_snapshot)(turn)
        await self.send_json({"type": "turn.snapshot", "turn": snapshot})

    async def _error(self, code: str, message: str, request: Any = None) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, "request": request})

    # Channel-layer events (built in inference/events.py), one handler each.
    async def chat_token(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["frame"])  # serialised once by the worker (events.token_frame)

    async def chat_turn_queued(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "turn.queued", "turn": event["turn"]})

    async def chat_turn_state(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "type": "turn.state"})  # turn, status; queue_position/ahead when waiting

    async def chat_turn_end(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "turn.end", "turn": event["turn"], "seq": event["seq"]})
