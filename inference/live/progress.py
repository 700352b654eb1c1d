"""The live progress of running turns for the board: tokens so far, tokens/s, prompt tokens and the slot's context.

The worker stores it in Redis (``rigdash:turn:<id>:progress``) and publishes ``board.progress`` at most every
``PROGRESS_INTERVAL_S`` per turn (``ProgressReporter``), not with every token batch; board rows read it back
(``read_many``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from inference import events
from inference.backends import backend_for, capabilities
from inference.backends.base import BackendError
from inference.live import state
from inference.models import Rig, Turn
from inference.tokens import estimate_prompt_tokens

PROGRESS_INTERVAL_S = 0.5
_N_CTX_TTL_S = 60.0
_n_ctx_cache: dict[tuple[str, str, str], tuple[float, int | None]] = {}


def progress_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:progress"


def context_fill(prompt_tokens: int | None, tokens: int | None, n_ctx: int | None) -> dict[str, Any]:
    """Tokens in the slot's context (prompt + reply so far) against its size (pure)."""
    used = None if prompt_tokens is None else prompt_tokens + (tokens or 0)
    ratio = None if used is None or not n_ctx else round(used / n_ctx, 4)
    return {"context_used": used, "n_ctx": n_ctx, "context_ratio": ratio}


async def slot_context_tokens(rig: Rig, model: str) -> int | None:
    """The rig's context per slot (llama-server ``/props``; Ollama's loaded model, per model), cached a minute per
    worker; None if unknown (not cached: an Ollama model not loaded yet has its context once it is)."""
    key = (rig.kind, rig.base_url, model if capabilities(rig.kind).context_per_model else "")
    cached = _n_ctx_cache.get(key)
    if cached and time.monotonic() - cached[0] < _N_CTX_TTL_S:
        return cached[1]
    try:
        n_ctx: int | None = await backend_for(rig, timeout_s=2.0).context_window(model)
    except BackendError:
        n_ctx = None
    if n_ctx is not None:
        _n_ctx_cache[key] = (time.monotonic(), n_ctx)
    return n_ctx


@dataclass
class ProgressReporter:
    """Throttled progress of one running turn for the board: stored in Redis and published, ≤ 2/s."""

    turn_id: int
    n_ctx: int | None
    prompt_tokens: int | None
    prompt_estimated: bool = True
    interval_s: float = PROGRESS_INTERVAL_S
    last_sent: float = -math.inf

    def backend_prompt(self, prompt_tokens: int | None) -> None:
        if prompt_tokens is not None and self.prompt_estimated:
            self.prompt_tokens, self.prompt_estimated = prompt_tokens, False

    def due(self) -> bool:
        return time.monotonic() - self.last_sent >= self.interval_s

    def take(self, *, tokens: int, decode_tps: float | None, status: str) -> dict[str, Any]:
        """The progress to send now; counts as sent (the next one is due an interval later)."""
        self.last_sent = time.monotonic()
        return {
            "turn": self.turn_id,
            "status": status,
            "tokens": tokens,
            "decode_tps": decode_tps,
            "prompt_tokens": self.prompt_tokens,
            "prompt_estimated": self.prompt_estimated,
            **context_fill(self.prompt_tokens, tokens, self.n_ctx),
        }

    async def tick(
        self, redis: aioredis.Redis, *, tokens: int, decode_tps: float | None, status: str, force: bool = False
    ) -> bool:
        """Store and publish the progress when it is due (or ``force``), in two round trips of its own. A streaming
        turn's batches carry it in their own round trip instead (``progress_commands``)."""
        if not force and not self.due():
            return False
        await send_progress(redis, self.take(tokens=tokens, decode_tps=decode_tps, status=status))
        return True


async def send_progress(redis: aioredis.Redis, progress: dict[str, Any]) -> None:
    await redis.set(progress_key(progress["turn"]), json.dumps(progress), ex=state.LIVE_TTL_S)
    await events.board_progress(progress=progress)


def progress_commands(progress: dict[str, Any]) -> list[tuple[Any, ...]] | None:
    """The Redis commands that store a turn's progress and publish it to the boards, for a batch's pipeline; None
    when the channel layer is not the one a PUBLISH can stand in for (then ``ProgressReporter.tick``)."""
    publication = events.pubsub_publication(events.BOARD_GROUP, events.board_progress_message(progress))
    if publication is None:
        return None
    stored = ("SET", progress_key(progress["turn"]), json.dumps(progress), "EX", state.LIVE_TTL_S)
    return [stored, ("PUBLISH", *publication)]


async def progress_start(turn: Turn, messages: list[dict[str, Any]], redis: aioredis.Redis) -> ProgressReporter:
    """A reporter for a turn that starts now, with its slot's context and an estimate of its prompt."""
    reporter = ProgressReporter(
        turn_id=turn.pk,
        n_ctx=_asked_context(turn) or await slot_context_tokens(turn.session.rig, turn.session.model_name),
        prompt_tokens=estimate_prompt_tokens(messages),
    )
    await reporter.tick(redis, tokens=0, decode_tps=None, status=Turn.Status.PROMPT, force=True)
    return reporter


def _asked_context(turn: Turn) -> int | None:
    """The context the turn asked for (``num_ctx``): Ollama loads the model with it; llama-server's is fixed."""
    asked = (turn.params or {}).get("num_ctx")
    return int(asked) if asked and capabilities(turn.session.rig.kind).context_per_request else None


def forget(turn_id: int) -> None:
    state.sync_client().delete(progress_key(turn_id))


def read_many(turn_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The stored progress of these turns, by id (a turn with none is left out)."""
    if not turn_ids:
        return {}
    raw = state.sync_client().mget([progress_key(turn_id) for turn_id in turn_ids])
    return {turn_id: json.loads(value) for turn_id, value in zip(turn_ids, raw, strict=True) if value}  # type: ignore[arg-type]
