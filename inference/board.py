"""The admin board's data: one row per turn across users and rigs, and the cheap live progress of running turns.

A row is built from the database (who, where, state, queue position) and, for a running turn, the
progress its worker last stored in Redis (``rigdash:turn:<id>:progress``: tokens so far, tokens/s,
prompt tokens, the slot's context). The worker writes that and publishes ``board.progress`` at most
every ``PROGRESS_INTERVAL_S`` per turn (``ProgressReporter``), not with every token batch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from django.utils import timezone

from inference import dispatch, events, live
from inference.backends import backend_for
from inference.backends.base import BackendError
from inference.models import Rig, Turn
from inference.quotas import estimate_prompt_tokens

PROGRESS_INTERVAL_S = 0.5
ENDED_ROWS = 50
ENDED_WINDOW = timedelta(hours=6)
_N_CTX_TTL_S = 60.0
_n_ctx_cache: dict[tuple[str, str], tuple[float, int | None]] = {}


def progress_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:progress"


def context_fill(prompt_tokens: int | None, tokens: int | None, n_ctx: int | None) -> dict[str, Any]:
    """Tokens in the slot's context (prompt + reply so far) against its size (pure)."""
    used = None if prompt_tokens is None else prompt_tokens + (tokens or 0)
    ratio = None if used is None or not n_ctx else round(used / n_ctx, 4)
    return {"context_used": used, "n_ctx": n_ctx, "context_ratio": ratio}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def board_row(turn: Turn, *, position: int | None, progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """A turn as the board shows it; ``turn`` needs session, its owner and rig loaded."""
    stats = turn.stats or {}
    progress = progress or {}
    if turn.is_active:
        tokens = progress.get("tokens", 0)
        decode_tps = progress.get("decode_tps")
        prompt_tokens = progress.get("prompt_tokens")
        n_ctx = progress.get("n_ctx")
    else:
        tokens = turn.output_tokens if turn.output_tokens is not None else stats.get("output_events", 0)
        decode_tps = stats.get("decode_tps")
        prompt_tokens = turn.prompt_tokens
        n_ctx = stats.get("context_limit")
    return {
        "id": turn.pk,
        "session": turn.session_id,
        "user": turn.session.owner.get_username(),
        "user_id": turn.session.owner_id,
        "rig": turn.session.rig.name,
        "rig_id": turn.session.rig_id,
        "model": turn.session.model_name,
        "status": turn.status,
        "finish_reason": turn.finish_reason,
        "queue_position": position,
        "tokens": tokens,
        "decode_tps": decode_tps,
        "prompt_tokens": prompt_tokens,
        **context_fill(prompt_tokens, tokens, n_ctx),
        "created_at": _iso(turn.created_at),
        "started_at": _iso(turn.started_at),
        "finished_at": _iso(turn.finished_at),
    }


def _progress_of(turn_ids: list[int]) -> dict[int, dict[str, Any]]:
    if not turn_ids:
        return {}
    raw = live.sync_client().mget([progress_key(turn_id) for turn_id in turn_ids])
    return {turn_id: json.loads(value) for turn_id, value in zip(turn_ids, raw, strict=True) if value}  # type: ignore[arg-type]


def _rows(turns: Iterable[Turn]) -> list[dict[str, Any]]:
    turns = list(turns)
    positions: dict[int, int] = {}
    for rig_id in {t.session.rig_id for t in turns if t.status == Turn.Status.QUEUED}:
        positions.update({w.turn_id: i + 1 for i, w in enumerate(dispatch.waiting_order(rig_id))})
    for turn in turns:
        if turn.status == Turn.Status.QUEUED and turn.dispatched_at is not None:
            positions[turn.pk] = 0
    progress = _progress_of([t.pk for t in turns if t.status in Turn.RUNNING])
    return [board_row(t, position=positions.get(t.pk), progress=progress.get(t.pk)) for t in turns]


def _with_people() -> Any:
    return Turn.objects.select_related("session", "session__owner", "session__rig")


def board_rows() -> list[dict[str, Any]]:
    """Every active turn (oldest first), then the turns that ended lately (newest first)."""
    active = _with_people().filter(status__in=Turn.ACTIVE).order_by("created_at", "id")
    ended = (
        _with_people()
        .exclude(status__in=Turn.ACTIVE)
        .filter(finished_at__gte=timezone.now() - ENDED_WINDOW)
        .order_by("-finished_at", "-id")[:ENDED_ROWS]
    )
    return _rows([*active, *ended])


def board_row_for(turn_id: int) -> dict[str, Any] | None:
    turn = _with_people().filter(pk=turn_id).first()
    return _rows([turn])[0] if turn else None


def publish_turn(turn_id: int) -> None:
    """Send the turn's current row to every board (when it is queued, starts or ends); nothing when no board is
    open anywhere (the row's queries were a fifth of a submit, docs/benchmarks.md)."""
    publish_turns([turn_id])


def publish_turns(turn_ids: list[int]) -> None:
    """``publish_turn`` for several turns: Redis is asked once whether a board is open, and the rows go out in one
    round trip."""
    if not events.board_watched():
        return
    rows = [row for row in map(board_row_for, turn_ids) if row is not None]
    if rows:
        events.board_turns_sync(rows=rows)


def rigs_summary() -> list[dict[str, Any]]:
    return [{"id": r.pk, "name": r.name, "slots": r.slots, "enabled": r.enabled} for r in Rig.objects.all()]


# Worker side -------------------------------------------------------------------------------------------


async def slot_context_tokens(rig: Rig, model: str) -> int | None:
    """The rig's context per slot (llama-server ``/props``), cached a minute per worker; None if unknown."""
    key = (rig.kind, rig.base_url)
    cached = _n_ctx_cache.get(key)
    if cached and time.monotonic() - cached[0] < _N_CTX_TTL_S:
        return cached[1]
    try:
        n_ctx: int | None = await backend_for(rig, timeout_s=2.0).context_window(model)
    except BackendError:
        n_ctx = None
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
    await redis.set(progress_key(progress["turn"]), json.dumps(progress), ex=live.LIVE_TTL_S)
    await events.board_progress(progress=progress)


def progress_commands(progress: dict[str, Any]) -> list[tuple[Any, ...]] | None:
    """The Redis commands that store a turn's progress and publish it to the boards, for a batch's pipeline; None
    when the channel layer is not the one a PUBLISH can stand in for (then ``ProgressReporter.tick``)."""
    publication = events.pubsub_publication(events.BOARD_GROUP, {"type": "board.progress", **progress})
    if publication is None:
        return None
    stored = ("SET", progress_key(progress["turn"]), json.dumps(progress), "EX", live.LIVE_TTL_S)
    return [stored, ("PUBLISH", *publication)]


async def progress_start(turn: Turn, messages: list[dict[str, str]], redis: aioredis.Redis) -> ProgressReporter:
    """A reporter for a turn that starts now, with its slot's context and an estimate of its prompt."""
    reporter = ProgressReporter(
        turn_id=turn.pk,
        n_ctx=await slot_context_tokens(turn.session.rig, turn.session.model_name),
        prompt_tokens=estimate_prompt_tokens(messages),
    )
    await reporter.tick(redis, tokens=0, decode_tps=None, status=Turn.Status.PROMPT, force=True)
    return reporter


def forget_progress(turn_id: int) -> None:
    live.sync_client().delete(progress_key(turn_id))
