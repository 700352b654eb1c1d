"""Every message that reaches a chat browser is built and sent here, and only here.

Groups: one per chat session (``chat.session.<id>``); a chat page joins its session's group.
Event types (one consumer handler each):
- ``chat.turn_queued``  a new turn was stored: its snapshot.
- ``chat.turn_state``   a turn changed phase (queued -> prompt -> decoding).
- ``chat.token``        a coalesced batch of tokens: turn id, seq_from..seq_to, text, running stats.
- ``chat.turn_end``     a turn ended: status, finish reason, error, final stats and last seq.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def session_group(session_id: int) -> str:
    return f"chat.session.{session_id}"


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
