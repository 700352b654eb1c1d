"""The live text of running turns, kept in Redis so a (re)connecting browser gets the reply so far.

Each coalesced batch the worker publishes is also appended to a Redis list, in the same order, as
``{"f": seq_from, "t": seq_to, "x": text}``. The snapshot of a turn is that list joined: its text and
the last seq it holds. Batches in the snapshot and live batches are the same units, so a client can
drop any live batch whose ``seq_to`` it already has. The database is written at the end of a turn
(and checkpointed every few seconds), never per token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
from django.conf import settings

LIVE_TTL_S = 24 * 3600  # a running turn's list outlives any turn; it is shortened when the turn ends
ENDED_TTL_S = 300


def live_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:live"


def cancel_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:cancel"


def encode_batch(seq_from: int, seq_to: int, text: str, stats: dict[str, Any] | None = None) -> str:
    """One batch as stored in the live list; ``s`` (the running stats) lets the sampler read a turn's
    progress with one LINDEX instead of a write per batch."""
    batch: dict[str, Any] = {"f": seq_from, "t": seq_to, "x": text}
    if stats is not None:
        batch["s"] = stats
    return json.dumps(batch, ensure_ascii=False, separators=(",", ":"))


def latest_stats(raw_batch: bytes | str | None) -> dict[str, Any] | None:
    if not raw_batch:
        return None
    stats = json.loads(raw_batch).get("s")
    return stats if isinstance(stats, dict) else None


@dataclass(frozen=True)
class LiveSnapshot:
    text: str
    seq: int


def decode_snapshot(raw_batches: list[bytes] | list[str]) -> LiveSnapshot:
    parts: list[str] = []
    seq = 0
    for raw in raw_batches:
        batch = json.loads(raw)
        if batch["f"] != seq + 1:  # never expected: the worker appends in order
            raise ValueError(f"live list out of order at seq {seq}: {batch['f']}")
        parts.append(batch["x"])
        seq = batch["t"]
    return LiveSnapshot(text="".join(parts), seq=seq)


@cache
def sync_client() -> redis.Redis:
    """A process-wide client for synchronous code (views, services); its pool is thread-safe."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, health_check_interval=30)


def snapshot(turn_id: int) -> LiveSnapshot:
    batches: list[bytes] = sync_client().lrange(live_key(turn_id), 0, -1)  # type: ignore[assignment]
    return decode_snapshot(batches)


def request_cancel(turn_id: int) -> None:
    sync_client().set(cancel_key(turn_id), "1", ex=LIVE_TTL_S)


def forget(turn_id: int) -> None:
    """Keep the live text a few minutes after the turn ends (the database has it), then drop it."""
    with sync_client().pipeline(transaction=False) as pipe:
        pipe.expire(live_key(turn_id), ENDED_TTL_S)
        pipe.delete(cancel_key(turn_id))
        pipe.execute()
