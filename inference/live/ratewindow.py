"""Sliding one-minute windows in Redis for rate limits: one sorted set per window (score: the time in ms), checked
and added to atomically by one Lua script, so two web processes cannot both admit the last request.

A request window holds one member per admitted request; a token window one member per finished turn, ``<id>:<n>``
for its n reply tokens. ``admit`` refuses when any window is at its limit, and says when the oldest entries that
keep it there leave the window: the ``Retry-After``. Refusals are counted in one hash for /metrics.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from inference.live.state import sync_client

WINDOW_MS = 60_000
REFUSALS_KEY = "rigdash:ratelimit:refused"

# KEYS: the windows. ARGV: now_ms, window_ms, member, then per key: kind ("r" requests, "t" tokens), limit.
# Returns {0, 0} (admitted: the member added to every request window) or {index (1-based), retry_ms}.
_ADMIT = """
local now, window, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i, key in ipairs(KEYS) do
  local kind, limit = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local total = 0
  for j = 1, #entries, 2 do
    total = total + (kind == 'r' and 1 or tonumber(string.match(entries[j], ':(%d+)$')))
  end
  if total >= limit then
    for j = 1, #entries, 2 do
      total = total - (kind == 'r' and 1 or tonumber(string.match(entries[j], ':(%d+)$')))
      if total < limit then return {i, tonumber(entries[j + 1]) + window - now} end
    end
    return {i, window}
  end
end
for i, key in ipairs(KEYS) do
  if ARGV[2 + 2 * i] == 'r' then
    redis.call('ZADD', key, now, member)
    redis.call('PEXPIRE', key, window)
  end
end
return {0, 0}
"""


@dataclass(frozen=True)
class Window:
    key: str
    kind: str  # "r": requests, "t": tokens
    limit: int


def window_key(scope: str, owner_id: int, kind: str) -> str:
    return f"rigdash:ratelimit:{scope}:{owner_id}:{kind}"


def admit(windows: list[Window], *, now_ms: int | None = None) -> tuple[Window | None, int]:
    """Admit one request into every request window unless a window is at its limit: (None, 0), or (that window, the
    milliseconds until it has room)."""
    if not windows:
        return None, 0
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    args: list[str] = [str(now_ms), str(WINDOW_MS), uuid.uuid4().hex]
    for w in windows:
        args += [w.kind, str(w.limit)]
    index, retry_ms = sync_client().eval(_ADMIT, len(windows), *[w.key for w in windows], *args)  # type: ignore[misc]
    if int(index) == 0:
        return None, 0
    return windows[int(index) - 1], max(1, int(retry_ms))


def tokens_add(keys: list[str], tokens: int, *, now_ms: int | None = None) -> None:
    """Count a finished turn's reply tokens in each token window."""
    if not keys or tokens <= 0:
        return
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    member = f"{uuid.uuid4().hex}:{int(tokens)}"
    pipe = sync_client().pipeline(transaction=True)
    for key in keys:
        pipe.zadd(key, {member: now_ms})
        pipe.pexpire(key, WINDOW_MS)
    pipe.execute()


def window_usage(key: str, kind: str, *, now_ms: int | None = None) -> int:
    """Requests (or tokens) in the window now."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    members: list[bytes] = sync_client().zrangebyscore(key, now_ms - WINDOW_MS, "+inf")  # type: ignore[assignment]
    if kind == "r":
        return len(members)
    return sum(int(m.rsplit(b":", 1)[1]) for m in members)


def refusal_count(label: str) -> None:
    sync_client().hincrby(REFUSALS_KEY, label, 1)


def refusals() -> dict[str, int]:
    """Refusals by ``<scope>:<limit>`` since Redis last lost them."""
    raw: dict[bytes, bytes] = sync_client().hgetall(REFUSALS_KEY)  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}
