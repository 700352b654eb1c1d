"""Liveness of everything a chat turn needs: database, Redis, Celery workers, each rig's backend and a worker
consuming each rig's queue (monitoring.queues)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Celery
from django.conf import settings
from django.db import connection

from inference.backends import backend_for
from inference.backends.base import BackendError
from inference.live import agents
from inference.live import state as live
from inference.models import Rig
from monitoring.queues import rig_consumers
from rigdash import redischeck


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "detail": connection.vendor}
    except Exception as exc:
        return {"ok": False, "detail": repr(exc)}
    finally:
        connection.close()  # this runs in a pool thread: do not leak its connection


def check_redis() -> dict[str, Any]:
    try:
        live.sync_client().ping()
        return {"ok": True, "detail": "pong"}
    except Exception as exc:
        # A refused password and an unreachable server read apart (rigdash/redischeck.py); never the password.
        return {"ok": False, "detail": redischeck.explain(exc, settings.REDIS_URL)}


def check_workers(timeout_s: float = 1.0, app: Celery | None = None) -> dict[str, Any]:
    from rigdash.celery import app as rigdash_app

    try:
        replies = (app or rigdash_app).control.ping(timeout=timeout_s)
    except Exception as exc:
        return {"ok": False, "detail": repr(exc), "workers": []}
    names = sorted(name for reply in replies for name in reply)
    return {"ok": bool(names), "detail": f"{len(names)} worker(s)" if names else "no worker answered", "workers": names}


def check_rig(rig: Rig) -> dict[str, Any]:
    """The rig's backend, and its agent where it has one (down when its heartbeat is stale or does not verify)."""
    agent = agents.agent_state(rig.pk, rig.agent_key)
    try:
        backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
        health = asyncio.run(backend.health())
    except BackendError as exc:
        return {"ok": False, "detail": str(exc), "kind": rig.kind, "url": rig.base_url, "agent": agent.as_dict()}
    ok = health.ok and (agent.up or not agent.expected)
    detail = health.detail if agent.up or not agent.expected else f"{health.detail}; {agent.describe()}"
    return {"ok": ok, "detail": detail, "kind": rig.kind, "url": rig.base_url, "agent": agent.as_dict()}


HEALTH_CACHE_S = 5.0  # a report this fresh is served again: callers never fan out to every backend per request
_cache_lock = threading.Lock()
_cached: tuple[float, tuple[Any, ...], dict[str, Any]] | None = None


def health_report(max_age_s: float = HEALTH_CACHE_S) -> dict[str, Any]:
    """The report, computed at most once per ``max_age_s`` per process for the same enabled rigs (concurrent
    callers wait for the one computing it)."""
    global _cached
    rigs = list(Rig.objects.filter(enabled=True).order_by("pk"))
    key = tuple((rig.pk, rig.kind, rig.base_url) for rig in rigs)
    with _cache_lock:
        now = time.monotonic()
        if _cached is not None and _cached[1] == key and now - _cached[0] < max_age_s:
            return _cached[2]
        report = _health_report(rigs)
        _cached = (time.monotonic(), key, report)
        return report


def _health_report(rigs: list[Rig]) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=4 + len(rigs)) as pool:
        futures = {
            "database": pool.submit(check_database),
            "redis": pool.submit(check_redis),
            "workers": pool.submit(check_workers),
        }
        queues = pool.submit(rig_consumers, rigs)
        rig_futures = {rig.name: pool.submit(check_rig, rig) for rig in rigs}
        checks = {name: future.result() for name, future in futures.items()}
        checks["rigs"] = {name: future.result() for name, future in rig_futures.items()}
        checks["queues"] = queues.result()
    down = [name for name in ("database", "redis", "workers") if not checks[name]["ok"]]
    down += [f"rig:{name}" for name, result in checks["rigs"].items() if not result["ok"]]
    down += [f"queue:{name}" for name, result in checks["queues"].items() if not result["ok"]]
    return {"status": "ok" if not down else "down", "down": down, "checks": checks}
