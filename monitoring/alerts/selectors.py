"""Reads for alerts: a rig's recent turns' figures, RigDash's disk, and the alerts page's lists."""

from __future__ import annotations

import math
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from inference.models import Turn
from monitoring.alerts.models import Alert, AlertChannel, AlertRule, Delivery, Silence

FINISHED = (Turn.Status.DONE, Turn.Status.FAILED, Turn.Status.INTERRUPTED)  # cancelled turns are a user's choice


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0-100) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def rig_turn_figures(*, rig_id: int, window_s: int, now: datetime) -> dict[str, Any]:
    """The rig's queue wait p95 over turns started in the window and turns still waiting (their wait so far), and
    its error rate over turns finished in the window."""
    since = now - timedelta(seconds=window_s)
    mine = Turn.objects.filter(rig_id=rig_id)
    started = mine.filter(started_at__gte=since).values_list("created_at", "started_at")
    waiting = mine.filter(status=Turn.Status.QUEUED, started_at__isnull=True).values_list("created_at", flat=True)
    waits = [(start - created).total_seconds() for created, start in started if start is not None]
    waits += [(now - created).total_seconds() for created in waiting]
    statuses = list(mine.filter(finished_at__gte=since, status__in=FINISHED).values_list("status", flat=True))
    failed = sum(1 for s in statuses if s != Turn.Status.DONE)
    return {
        "queue_wait_p95_s": percentile(waits, 95),
        "error_rate": failed / len(statuses) if statuses else None,
        "finished_turns": len(statuses),
    }


def disk_used_pct(path: str | None = None) -> float:
    """How full the disk holding RigDash's var directory is, in percent."""
    where = Path(path or settings.VAR_DIR)
    while not where.exists() and where != where.parent:
        where = where.parent
    usage = shutil.disk_usage(where)
    return round(100.0 * usage.used / usage.total, 2)


def alerts_firing() -> QuerySet[Alert]:
    return Alert.objects.filter(state=Alert.State.FIRING).select_related("rule", "rig", "acknowledged_by")


def alerts_history(*, limit: int = 100) -> QuerySet[Alert]:
    return Alert.objects.filter(state=Alert.State.RESOLVED).select_related("rule", "rig", "acknowledged_by")[:limit]


def silences_active(now: datetime) -> QuerySet[Silence]:
    return Silence.objects.filter(until__gt=now).select_related("rule", "rig", "created_by")


def page_context(now: datetime) -> dict[str, Any]:
    return {
        "firing": list(alerts_firing()),
        "history": list(alerts_history()),
        "rules": list(AlertRule.objects.select_related("rig")),
        "channels": list(AlertChannel.objects.all()),
        "silences": list(silences_active(now)),
        "deliveries": list(Delivery.objects.select_related("alert__rule", "channel")[:50]),
    }
