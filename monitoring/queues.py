"""Which rig queues a Celery worker consumes: a rig whose queue has none leaves its chats waiting forever.

One broadcast (``inspect().active_queues()``) with a short timeout answers for every rig; its answer is kept a
few seconds so that /healthz polled every second and each rig page do not broadcast each time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from celery import Celery
from redis.exceptions import RedisError

from inference.live import consumers as live_consumers
from inference.models import Rig

log = logging.getLogger(__name__)

CACHE_S = 5.0
TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Consumers:
    """The queues the workers that answered consume, worker by worker; ``error`` when the broadcast failed."""

    by_worker: dict[str, frozenset[str]]
    error: str = ""

    @property
    def queues(self) -> frozenset[str]:
        return frozenset().union(*self.by_worker.values()) if self.by_worker else frozenset()

    def workers_of(self, queue: str) -> list[str]:
        return sorted(name for name, queues in self.by_worker.items() if queue in queues)


_lock = threading.Lock()
_cached: tuple[float, Consumers] | None = None


def consumers(*, timeout_s: float = TIMEOUT_S, app: Celery | None = None, max_age_s: float = CACHE_S) -> Consumers:
    """The workers' queues now, or as read at most ``max_age_s`` ago (0: read again)."""
    global _cached
    with _lock:
        if _cached is not None and app is None and time.monotonic() - _cached[0] < max_age_s:
            return _cached[1]
    found = _ask(timeout_s=timeout_s, app=app)
    if app is None:
        with _lock:
            _cached = (time.monotonic(), found)
    return found


_refreshing = threading.Event()


def consumers_nowait(*, timeout_s: float = TIMEOUT_S, max_age_s: float = CACHE_S) -> Consumers | None:
    """The last answer if it is fresh, else None at once while one thread asks again (for pages every user
    opens: a broadcast waits its whole timeout, which a chat page must not)."""
    with _lock:
        fresh = _cached is not None and time.monotonic() - _cached[0] < max_age_s
        if fresh and _cached is not None:
            return _cached[1]
        stale = _cached[1] if _cached is not None else None
        if _refreshing.is_set():
            return stale
        _refreshing.set()

    def refresh() -> None:
        try:
            consumers(timeout_s=timeout_s, max_age_s=0)
        finally:
            _refreshing.clear()

    threading.Thread(target=refresh, name="rig-queues", daemon=True).start()
    return stale


def _ask(*, timeout_s: float, app: Celery | None) -> Consumers:
    from rigdash.celery import app as rigdash_app

    try:
        replies = (app or rigdash_app).control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception as exc:
        return Consumers(by_worker={}, error=repr(exc))
    found = Consumers(
        by_worker={worker: frozenset(q["name"] for q in queues or ()) for worker, queues in replies.items()}
    )
    if app is None:  # RigDash's own workers: the turns' waiting reasons read this answer (inference/live/consumers.py)
        try:
            live_consumers.record(found.queues)
        except RedisError as exc:
            log.warning("the workers' queues were not recorded: %r", exc)
    return found


def rig_consumers(rigs: Iterable[Rig], found: Consumers | None = None) -> dict[str, dict[str, object]]:
    """Per rig name: its queue, the workers consuming it and ``ok`` (at least one)."""
    found = found if found is not None else consumers()
    report: dict[str, dict[str, object]] = {}
    for rig in rigs:
        workers = found.workers_of(rig.queue)
        detail = f"{len(workers)} worker(s)" if workers else f"no worker consumes {rig.queue}"
        if found.error:
            detail = f"cannot ask the workers: {found.error}"
        report[rig.name] = {"ok": bool(workers), "queue": rig.queue, "workers": workers, "detail": detail}
    return report


def forget() -> None:
    """Drop the cached answer (tests; a worker just started)."""
    global _cached
    with _lock:
        _cached = None
