"""Every message that reaches a browser from the inference app is built and sent here, and only here.

Groups: one per chat session (``chat.session.<id>``); a chat page joins its session's group.
One per rig's model management (``rig.<id>.models``); only staff sockets join it.
Event types (one consumer handler each):
- ``chat.turn_queued``  a new turn was stored: its snapshot.
- ``chat.turn_state``   a turn changed phase (queued -> prompt -> decoding).
- ``chat.token``        a coalesced batch of tokens: turn id, seq_from..seq_to, text, running stats.
- ``chat.turn_end``     a turn ended: status, finish reason, error, final stats and last seq.
- ``models.pull_progress``  a model download step: pull id, model, status, digest, total, completed.
- ``models.pull_end``       a download ended: ok, or error {code, message}.
- ``models.changed``        a model was deleted or unloaded (pages re-read the rig's models).
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


def rig_models_group(rig_id: int) -> str:
    return f"rig.{rig_id}.models"


async def models_pull_progress(
    *, rig_id: int, pull_id: str, model: str, status: str, digest: str | None, total: int | None, completed: int | None
) -> None:
    await _layer().group_send(
        rig_models_group(rig_id),
        {
            "type": "models.pull_progress",
            "rig": rig_id,
            "pull": pull_id,
            "model": model,
            "status": status,
            "digest": digest,
            "total": total,
            "completed": completed,
        },
    )


async def models_pull_end(
    *, rig_id: int, pull_id: str, model: str, ok: bool, error: dict[str, str] | None = None
) -> None:
    await _layer().group_send(
        rig_models_group(rig_id),
        {"type": "models.pull_end", "rig": rig_id, "pull": pull_id, "model": model, "ok": ok, "error": error},
    )


def models_changed_sync(*, rig_id: int, action: str, model: str) -> None:
    async_to_sync(_layer().group_send)(
        rig_models_group(rig_id), {"type": "models.changed", "rig": rig_id, "action": action, "model": model}
    )
