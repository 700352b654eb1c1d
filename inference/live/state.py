"""The live text of running turns, kept in Redis so a (re)connecting browser gets the reply so far.

Each coalesced batch the worker publishes is also appended to a Redis list, in the same order, as
``{"f": seq_from, "t": seq_to, "x": text}``, with ``"k": thinking`` when the batch holds a reasoning model's
thoughts (its own part of the turn, numbered in the same seq). The snapshot of a turn is that list joined: its
text, its thinking and the last seq it holds. Batches in the snapshot and live batches are the same units, so a
client can drop any live batch whose ``seq_to`` it already has. The database is written at the end of a turn
(and checkpointed every few seconds), never per token.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
import redis
from django.conf import settings
from redis.exceptions import RedisError

from inference.live.link import RedisLink

log = logging.getLogger(__name__)

LIVE_TTL_S = 24 * 3600  # a running turn's list outlives any turn; it is shortened when the turn ends
ENDED_TTL_S = 300
REDIS_RETRY_S = 0.25  # while Redis is unreachable, a write is tried again this often


def live_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:live"


def cancel_key(turn_id: int) -> str:
    return f"rigdash:turn:{turn_id}:cancel"


def encode_batch(
    seq_from: int, seq_to: int, text: str, stats: dict[str, Any] | None = None, *, thinking: str = ""
) -> str:
    """One batch as stored in the live list; ``s`` (the running stats) lets the sampler read a turn's
    progress with one LINDEX instead of a write per batch."""
    batch: dict[str, Any] = {"f": seq_from, "t": seq_to, "x": text}
    if thinking:
        batch["k"] = thinking
    if stats is not None:
        batch["s"] = stats
    return orjson.dumps(batch).decode()


def latest_stats(raw_batch: bytes | str | None) -> dict[str, Any] | None:
    if not raw_batch:
        return None
    stats = json.loads(raw_batch).get("s")
    return stats if isinstance(stats, dict) else None


@dataclass(frozen=True)
class LiveSnapshot:
    text: str
    seq: int
    thinking: str = ""


def decode_snapshot(raw_batches: list[bytes] | list[str]) -> LiveSnapshot:
    parts: list[str] = []
    thoughts: list[str] = []
    seq = 0
    for raw in raw_batches:
        batch = json.loads(raw)
        if batch["f"] != seq + 1:  # never expected: the worker appends in order
            raise ValueError(f"live list out of order at seq {seq}: {batch['f']}")
        parts.append(batch["x"])
        thoughts.append(batch.get("k", ""))
        seq = batch["t"]
    return LiveSnapshot(text="".join(parts), seq=seq, thinking="".join(thoughts))


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


@dataclass
class LiveList:
    """The worker's writes to one running turn's live list. Each batch is appended in its own round trip; when a
    write failed, or Redis lost entries without any command failing (it restarted and the client reconnected), the
    list is rewritten whole as one batch of the reply so far, so a snapshot always holds seq 1..n."""

    turn_id: int
    broken: bool = False  # a write failed: the list is rewritten whole once Redis answers
    entries: int = 0  # entries the list should hold now (checked against each RPUSH's reply)
    retry_at: float = float("-inf")  # after a failed write, the next try waits until then (no busy loop)

    def append(
        self,
        pipe: Any,
        seq_from: int,
        seq_to: int,
        text: str,
        stats: dict[str, Any],
        *,
        parts: Sequence[str],
        rewrite: bool | None = None,
        thinking: str = "",
        thoughts: Sequence[str] = (),
    ) -> int:
        """Queue a batch's commands on ``pipe`` (``parts`` and ``thoughts``: the reply's text and thinking per seq,
        for a rewrite, which happens when the list is ``broken`` or ``rewrite`` says so); returns where the RPUSH's
        reply will be among the pipeline's replies."""
        key = live_key(self.turn_id)
        rewrite = self.broken if rewrite is None else rewrite
        pushed_at = 0
        if rewrite:  # a failed pipeline may have run part-way: rewrite rather than append
            pipe.delete(key)
            whole = encode_batch(1, seq_to, "".join(parts[:seq_to]), stats, thinking="".join(thoughts[:seq_to]))
            pipe.rpush(key, whole)
            pushed_at = 1
        else:
            pipe.rpush(key, encode_batch(seq_from, seq_to, text, stats, thinking=thinking))
        if seq_from == 1 or rewrite:
            pipe.expire(key, LIVE_TTL_S)
        return pushed_at

    def appended(self, length: Any, *, rebuilt: bool) -> bool:
        """The batch is in: ``length`` is RPUSH's reply. False when the list lost entries (then ``rebuild``)."""
        self.broken = False
        self.entries = 1 if rebuilt else self.entries + 1
        return bool(length == self.entries)

    async def rebuild(
        self, link: RedisLink, seq_to: int, stats: dict[str, Any], *, parts: Sequence[str], thoughts: Sequence[str] = ()
    ) -> None:
        log.warning("turn %s: the live list lost entries (Redis restarted?); rebuilding it", self.turn_id)
        try:
            async with link.pipeline() as pipe:
                self.append(pipe, 1, seq_to, "", stats, parts=parts, rewrite=True, thoughts=thoughts)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self.away(exc)  # the next flush with text rewrites it
            return
        self.entries = 1

    def away(self, exc: Exception) -> None:
        """Redis did not answer: the list must be rewritten whole once it does, and the next try waits."""
        if not self.broken:
            log.warning("turn %s: Redis unavailable while streaming (%r); holding tokens", self.turn_id, exc)
        self.broken = True
        self.retry_at = time.perf_counter() + REDIS_RETRY_S
