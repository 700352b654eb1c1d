"""Which rig queues a Celery worker consumed at the last look, kept in Redis for the turns' waiting reason.

Asking the workers is a broadcast that waits its timeout (monitoring/queues.py); the sampler asks every few seconds
and every answer is recorded here, so that a chat page and the periodic dispatch (inference/queue/dispatch.py) can
tell a waiting user "no worker serves this rig" with one GET. An answer older than ``FRESH_S`` tells nothing: with
no sampler running, nobody is told a worker is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from inference.live import state

KEY = "rigdash:queues:consumed"
FRESH_S = 30.0
# A waiting turn's reason when no worker consumes its rig's queue; static/rigdash/chat.js shows the page's banner on
# it (tests/test_rig_queues.py checks that both say the same).
NO_WORKER = "waiting: no worker serves this rig right now"


def told_key(rig_id: int) -> str:
    """The waiting reason last announced to the rig's waiting turns (the periodic dispatch tells changes only)."""
    return f"rigdash:rig:{rig_id}:waiting_told"


def record(queues: Iterable[str], *, now: float | None = None) -> None:
    body = json.dumps({"ts": time.time() if now is None else now, "queues": sorted(queues)})
    state.sync_client().set(KEY, body, ex=int(FRESH_S * 4))


def unconsumed(queue: str, *, now: float | None = None) -> bool:
    """True only when a fresh answer says that no worker consumes ``queue``."""
    raw = state.sync_client().get(KEY)
    if raw is None:
        return False
    try:
        body = json.loads(raw)  # type: ignore[arg-type]
        fresh = (time.time() if now is None else now) - float(body["ts"]) <= FRESH_S
        return fresh and queue not in body["queues"]
    except (ValueError, TypeError, KeyError):
        return False


def swap_told(rig_id: int, reason: str) -> str:
    """Store ``reason`` as the one announced for the rig; returns the one announced before ("" if none)."""
    old = state.sync_client().getset(told_key(rig_id), reason)
    state.sync_client().expire(told_key(rig_id), 24 * 3600)
    return old.decode() if isinstance(old, bytes) else ""
