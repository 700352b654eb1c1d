"""Whole answers of turns that stream nothing (an embeddings request's vectors, a rerank's scores:
inference/worker/embed.py), kept in Redis from the worker's end of the turn until the view that waits on it reads them
once, never in the database."""

from __future__ import annotations

import json
from typing import Any, cast

from inference.live import state

ANSWER_TTL_S = 900  # a view that went away leaves it this long (RIGDASH_API_FORGET_AFTER_S' default)


def answer_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:answer"


async def answer_put(redis: Any, turn_id: int, answer: dict[str, Any]) -> None:
    await redis.set(answer_key(turn_id), json.dumps(answer, separators=(",", ":")), ex=ANSWER_TTL_S)


def answer_take(turn_id: int) -> dict[str, Any] | None:
    """The turn's answer, once (it is deleted as it is read); None when it is gone (expired, or read already)."""
    raw = cast(bytes | None, state.sync_client().getdel(answer_key(turn_id)))
    found = json.loads(raw) if raw else None
    return found if isinstance(found, dict) else None
