"""Every message that reaches a chat browser is built and sent here, and only here.

Groups: one per chat session (``chat.session.<id>``); a chat page joins its session's group.
Event types (one consumer handler each):
- ``chat.turn_queued``  a new turn was stored: its snapshot.
- ``chat.turn_state``   a turn changed phase (queued -> prompt -> decoding), or a waiting turn's place in
                        its rig's fair queue changed (``queue_position``: 0 starting, n: n-1 wait ahead).
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


async def turn_state(*, session_id: int, turn_id: int, status: str) -> None:
    await _layer().group_send(session_group(session_id), {"type": "chat.turn_state", "turn": turn_id, "status": status})


async def turn_end(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    await _layer().group_send(session_group(session_id), {"type": "chat.turn_end", "turn": turn, "seq": seq})


def turn_end_sync(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    async_to_sync(turn_end)(session_id=session_id, turn=turn, seq=seq)


def turn_queued_sync(*, session_id: int, turn: dict[str, Any]) -> None:
    async_to_sync(_layer().group_send)(session_group(session_id), {"type": "chat.turn_queued", "turn": turn})


def queue_positions_sync(*, rig_id: int, waiting: list[tuple[int, int, int]]) -> None:
    """After a dispatch: each waiting turn's place, ``(session_id, turn_id, position)``, to its chat page
    (``chat.turn_state``) and all of them to the board (``board.queue``), in one hop to the event loop."""

    async def send_all() -> None:
        layer = _layer()
        for session_id, turn_id, position in waiting:
            await layer.group_send(
                session_group(session_id),
                {
                    "type": "chat.turn_state",
                    "turn": turn_id,
                    "status": "queued",
                    "queue_position": position,
                    "queue_ahead": max(0, position - 1),
                },
            )
        positions = {str(turn_id): position for _, turn_id, position in waiting}
        await layer.group_send(BOARD_GROUP, {"type": "board.queue", "rig": rig_id, "positions": positions})

    async_to_sync(send_all)()


def board_turn_sync(*, row: dict[str, Any]) -> None:
    async_to_sync(_layer().group_send)(BOARD_GROUP, {"type": "board.turn", "turn": row})


async def board_progress(*, progress: dict[str, Any]) -> None:
    await _layer().group_send(BOARD_GROUP, {"type": "board.progress", **progress})


def user_revoked_sync(*, user_id: int) -> None:
    async_to_sync(_layer().group_send)(user_group(user_id), {"type": "user.revoked", "user": user_id})
