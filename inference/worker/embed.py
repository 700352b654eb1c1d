"""An embeddings request's turn (``Turn.params["embeddings"]``, made by inference/turns/api.py): the worker asks the
rig's backend for the vectors, as it streams a reply for any other turn, so the request waited in the fair queue and
counts in quotas, the board and usage like one. Nothing is decoded: the answer is one JSON document, kept in Redis
for the view that waits on the turn's end (inference/live/answers.py), never in the database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from django.conf import settings
from redis.exceptions import RedisError

from inference.backends import backend_for
from inference.backends.base import BackendError, BackendRefused, user_message
from inference.live import answers, state
from inference.models import Rig, Turn
from inference.turns import lifecycle

T = TypeVar("T")
CANCEL_POLL_S = 0.2  # how often a waiting embeddings request reads its turn's cancel flag (a Stop on the board)


class _Cancelled(Exception):
    pass


async def _unless_cancelled(turn_id: int, redis: Any, request: Coroutine[Any, Any, T]) -> T:
    """``request``'s result, unless the turn's cancel flag is set while it waits: the request is then dropped (its
    connection closed, so the backend stops) and _Cancelled raised. A flag that cannot be read counts as unset."""
    task = asyncio.ensure_future(request)
    try:
        while not (await asyncio.wait({task}, timeout=CANCEL_POLL_S))[0]:
            try:
                flagged = await redis.get(state.cancel_key(turn_id))
            except (OSError, RedisError):
                flagged = None
            if flagged:
                raise _Cancelled
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def embeddings_outcome(turn: Turn, rig: Rig, redis: Any) -> lifecycle.TurnOutcome:
    """Ask the rig for the turn's vectors; the answer goes to Redis, the turn's end says how it went (a backend's
    refusal keeps its status and words for the API client, as a reply's does)."""
    body = {**((turn.params or {}).get("passthrough") or {}), "model": turn.session.model_name}
    backend = backend_for(rig, timeout_s=settings.RIGDASH.first_token_timeout_s)
    started = time.perf_counter()
    stats: dict[str, Any] = {"output_events": 0, "output_tokens": 0}
    try:
        answer = await _unless_cancelled(turn.pk, redis, backend.embeddings(body))
        if not isinstance(answer, dict) or not isinstance(data := answer.get("data"), list):
            raise BackendError(f"the backend's embeddings answer has no data list: {str(answer)[:200]}")
        await answers.answer_put(redis, turn.pk, answer)
    except BackendError as exc:
        stats |= {"e2e_ms": round((time.perf_counter() - started) * 1000, 3), "error_detail": str(exc)}
        if isinstance(exc, BackendRefused):
            stats["backend_refused"] = {"status": exc.status, "message": exc.words}
        return lifecycle.TurnOutcome(status=Turn.Status.FAILED, reply_text="", finish_reason=exc.code, stats=stats,
                                     error=user_message(rig.name, exc))  # fmt: skip
    except _Cancelled:
        stats["e2e_ms"] = round((time.perf_counter() - started) * 1000, 3)
        return lifecycle.TurnOutcome(status=Turn.Status.CANCELLED, reply_text="", finish_reason="cancelled",
                                     stats=stats)  # fmt: skip
    except (OSError, RedisError) as exc:
        stats["error_detail"] = repr(exc)
        return lifecycle.TurnOutcome(status=Turn.Status.FAILED, reply_text="", finish_reason="redis_unavailable",
                                     stats=stats, error="The answer could not be kept for its request.")  # fmt: skip
    usage = answer.get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    stats |= {"e2e_ms": round((time.perf_counter() - started) * 1000, 3), "embeddings": len(data)}
    if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens >= 0:
        stats["prompt_tokens"] = prompt_tokens
    return lifecycle.TurnOutcome(status=Turn.Status.DONE, reply_text="", finish_reason="stop", stats=stats)
