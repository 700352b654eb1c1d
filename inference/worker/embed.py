"""A turn answered whole (``inference.turns.params.ONE_ANSWER``, made by inference/turns/api.py): an embeddings
request's vectors, or a rerank's scores. The worker asks the rig's backend, as it streams a reply for any other turn,
so the request waited in the fair queue and counts in quotas, the board and usage like one. Nothing is decoded: the
answer is one JSON document, kept in Redis for the view that waits on the turn's end (inference/live/answers.py),
never in the database.
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
from inference.worker.loading import first_answer_limit_s, model_needs_load

T = TypeVar("T")
CANCEL_POLL_S = 0.2  # how often a waiting embeddings request reads its turn's cancel flag (a Stop on the board)
BACKSTOP_S = 1.0  # how far past the longest wait _answered allows the HTTP client's own timeout lies


class _Cancelled(Exception):
    pass


class _TimedOut(Exception):
    pass


async def _answered(
    turn_id: int, redis: Any, request: Coroutine[Any, Any, T], loading: asyncio.Task[bool], what: str
) -> T:
    """``request``'s result, unless while it waits the turn's cancel flag is set (_Cancelled; a flag that cannot be
    read counts as unset) or the server has not answered within ``first_answer_limit_s`` (_TimedOut), which grants
    the model's load once ``loading`` says the server loads it first (so no timeout is declared before ``loading``
    has answered). Either drops the request (its connection closed, so the backend stops)."""
    task = asyncio.ensure_future(request)
    started = time.perf_counter()
    try:
        while True:
            limit = first_answer_limit_s(settings.RIGDASH, loading=_said(loading))
            left = limit - (time.perf_counter() - started)
            if left <= 0 and loading.done():  # a pending load check ends within its own LOADED_CHECK_S
                raise _TimedOut(f"The backend sent nothing for {limit:g} s while waiting for {what}.")
            if (await asyncio.wait({task}, timeout=min(CANCEL_POLL_S, left) if left > 0 else CANCEL_POLL_S))[0]:
                return task.result()
            try:
                flagged = await redis.get(state.cancel_key(turn_id))
            except (OSError, RedisError):
                flagged = None
            if flagged:
                raise _Cancelled
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _said(loading: asyncio.Task[bool]) -> bool:
    return loading.done() and not loading.cancelled() and loading.exception() is None and loading.result()


async def embeddings_outcome(turn: Turn, rig: Rig, redis: Any) -> lifecycle.TurnOutcome:
    """Ask the rig for the turn's vectors (or a rerank's scores); the answer goes to Redis, the turn's end says how it
    went (a backend's refusal keeps its status and words for the API client, as a reply's does). Whether the server
    loads the model first is asked beside the request, as for a reply (inference/worker/loading.py)."""
    model = turn.session.model_name
    body = {**((turn.params or {}).get("passthrough") or {}), "model": model}
    # _answered ends the wait; the HTTP client's own timeout is only a backstop.
    backend = backend_for(rig, timeout_s=first_answer_limit_s(settings.RIGDASH, loading=True) + BACKSTOP_S)
    started = time.perf_counter()
    stats: dict[str, Any] = {"output_events": 0, "output_tokens": 0}
    rerank = bool((turn.params or {}).get("rerank"))
    request = backend.rerank(body) if rerank else backend.embeddings(body)
    loading = asyncio.ensure_future(model_needs_load(rig, model))
    try:
        what = "the rerank's scores" if rerank else "the embeddings"
        answer: Any = await _answered(turn.pk, redis, request, loading, what)
        await answers.answer_put(redis, turn.pk, _kept(answer, rerank))
    except BackendError as exc:
        stats |= {"e2e_ms": _ms_since(started), "error_detail": str(exc)}
        if isinstance(exc, BackendRefused):
            stats["backend_refused"] = {"status": exc.status, "message": exc.words}
        return lifecycle.TurnOutcome(status=Turn.Status.FAILED, reply_text="", finish_reason=exc.code, stats=stats,
                                     error=user_message(rig.name, exc))  # fmt: skip
    except _TimedOut as exc:
        stats["e2e_ms"] = _ms_since(started)
        return lifecycle.TurnOutcome(status=Turn.Status.FAILED, reply_text="", finish_reason="timeout", stats=stats,
                                     error=str(exc))  # fmt: skip
    except _Cancelled:
        stats["e2e_ms"] = _ms_since(started)
        return lifecycle.TurnOutcome(status=Turn.Status.CANCELLED, reply_text="", finish_reason="cancelled",
                                     stats=stats)  # fmt: skip
    except (OSError, RedisError) as exc:
        stats["error_detail"] = repr(exc)
        return lifecycle.TurnOutcome(status=Turn.Status.FAILED, reply_text="", finish_reason="redis_unavailable",
                                     stats=stats, error="The answer could not be kept for its request.")  # fmt: skip
    finally:
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
        if _said(loading):  # the server loaded the model first: each outcome above holds this dict
            stats["model_loading"] = True
    usage = answer.get("usage") if isinstance(answer, dict) else None
    # A rerank's tokens are all prompt: vLLM's rerank usage names only total_tokens.
    fallback = usage.get("total_tokens") if rerank and isinstance(usage, dict) else None
    prompt_tokens = usage.get("prompt_tokens", fallback) if isinstance(usage, dict) else None
    if rerank:  # the documents scored (a top_n answer lists fewer)
        documents = body.get("documents", body.get("texts"))
        stats["reranked"] = len(documents) if isinstance(documents, list) else 0
    else:
        stats["embeddings"] = len(answer["data"])
    stats["e2e_ms"] = _ms_since(started)
    if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens >= 0:
        stats["prompt_tokens"] = prompt_tokens
    return lifecycle.TurnOutcome(status=Turn.Status.DONE, reply_text="", finish_reason="stop", stats=stats)


def _kept(answer: Any, rerank: bool) -> dict[str, Any]:
    """What Redis keeps of the backend's answer for the view (TEI's rerank list under ``tei``); BackendError for an
    answer without its list of vectors or scores."""
    if rerank:
        results = answer.get("results") if isinstance(answer, dict) else answer
        if not isinstance(results, list):
            raise BackendError(f"the backend's rerank answer has no results: {str(answer)[:200]}")
        return answer if isinstance(answer, dict) else {"tei": answer}
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        raise BackendError(f"the backend's embeddings answer has no data list: {str(answer)[:200]}")
    return answer


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
