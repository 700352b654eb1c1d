"""Every message that reaches a chat browser is built and sent here, and only here.

Groups: one per chat session (``chat.session.<id>``); a chat page joins its session's group.
Event types (one consumer handler each):
- ``chat.turn_queued``  a new turn was stored: its snapshot.
- ``chat.turn_state``   a turn changed phase (queued -> prompt -> decoding).
- ``chat.token``        a coalesced batch of tokens: turn id, seq_from..seq_to, text, running stats.
- ``chat.turn_end``     a turn ended: status, finish reason, error, final stats and last seq.

The admin board (group ``board``, staff sockets only; inference/consumers_board.py):
- ``board.turn``      one turn's board row (user, rig, model, state, tokens...) when it is queued, starts or ends.
- ``board.progress``  a running turn's tokens so far, tokens/s and context fill, at most ~2 per second.
- ``board.queue``     a rig's waiting turns and their queue positions, after each dispatch.

Per user (group ``user.<id>``, every socket of that user): ``user.revoked``: the user was deactivated or
their rights changed; sockets re-check and close what they may no longer see.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def session_group(session_id: int) -> str:
    return f"chat.session.{session_id}"


BOARD_GROUP = "board"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def _layer() -> Any:
    return get_channel_layer()


async def token_batch(
    *, session_id: int, turn_id: int, seq_from: int, seq_to: int, text: str, stats: dict[str, Any]
) -> None:
    await _layer().group_send(
        session_group(session_id),
        {
            "type": "chat.token",
            "turn": turn_id,
            "seq_from": seq_from,
            "seq_to": seq_to,
            "text": text,
            "stats": stats,
        },
    )


async def turn_state(
    *, session_id: int, turn_id: int, status: str, queue_position: int | None = None, queue_ahead: int | None = None
) -> None:
    """A turn's phase; a waiting turn's also carries its place in the rig's fair queue (0: starting)."""
    event: dict[str, Any] = {"type": "chat.turn_state", "turn": turn_id, "status": status}
    if queue_position is not None:
        event.update(queue_position=queue_position, queue_ahead=queue_ahead)
    await _layer().group_send(session_group(session_id), event)


def turn_state_sync(
    *, session_id: int, turn_id: int, status: str, queue_position: int | None = None, queue_ahead: int | None = None
) -> None:
    async_to_sync(turn_state)(
        session_id=session_id, turn_id=turn_id, status=status, queue_position=queue_position, queue_ahead=queue_ahead
    )


async def turn_end(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    await _layer().group_send(session_group(session_id), {"type": "chat.turn_end", "turn": turn, "seq": seq})


def turn_end_sync(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    async_to_sync(turn_end)(session_id=session_id, turn=turn, seq=seq)


def turn_queued_sync(*, session_id: int, turn: dict[str, Any]) -> None:
    async_to_sync(_layer().group_send)(session_group(session_id), {"type": "chat.turn_queued", "turn": turn})


def board_turn_sync(*, row: dict[str, Any]) -> None:
    async_to_sync(_layer().group_send)(BOARD_GROUP, {"type": "board.turn", "turn": row})


async def board_progress(*, progress: dict[str, Any]) -> None:
    await _layer().group_send(BOARD_GROUP, {"type": "board.progress", **progress})


def board_queue_sync(*, rig_id: int, positions: dict[int, int]) -> None:
    event = {"type": "board.queue", "rig": rig_id, "positions": {str(k): v for k, v in positions.items()}}
    async_to_sync(_layer().group_send)(BOARD_GROUP, event)


def user_revoked_sync(*, user_id: int) -> None:
    async_to_sync(_layer().group_send)(user_group(user_id), {"type": "user.revoked", "user": user_id})
