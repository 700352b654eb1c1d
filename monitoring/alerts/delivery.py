"""Delivering alerts off the sampler's path: each delivery runs on a small thread pool, with a timeout per try
(``transports.HTTP_TIMEOUT_S``, ``EMAIL_TIMEOUT``) and retries after RETRY_S; its row records every try. A
sampler that restarts sends again what was still pending (``deliveries_resume``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

from django.db import close_old_connections, connection
from django.db.models import F
from django.utils import timezone

from monitoring.alerts.models import Delivery
from monitoring.alerts.transports import TRANSPORTS

log = logging.getLogger(__name__)
RETRY_S = (0.0, 2.0, 5.0, 15.0)  # the wait before each try
RESUME_WITHIN = timedelta(hours=1)
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="alert-delivery")
        return _pool


def deliveries_send(delivery_ids: Iterable[int]) -> list[Future[bool]]:
    """Send each delivery on the pool; returns at once."""
    return [_executor().submit(_deliver, delivery_id) for delivery_id in delivery_ids]


def delivery_try(delivery_id: int) -> bool:
    """One try of a pending delivery; True once sent."""
    delivery = Delivery.objects.select_related("alert__rule", "alert__rig", "channel").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != Delivery.Status.PENDING:
        return True
    Delivery.objects.filter(pk=delivery_id).update(attempts=F("attempts") + 1)
    try:
        TRANSPORTS[delivery.channel.kind](delivery.channel, delivery.alert, delivery.event)
    except Exception as exc:
        Delivery.objects.filter(pk=delivery_id).update(error=f"{type(exc).__name__}: {exc}"[:2000])
        log.warning("alert delivery %s to %s failed: %r", delivery_id, delivery.channel, exc)
        return False
    Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING).update(
        status=Delivery.Status.SENT, sent_at=timezone.now(), error=""
    )
    return True


def _deliver(delivery_id: int) -> bool:
    try:
        for wait_s in RETRY_S:
            time.sleep(wait_s)
            if delivery_try(delivery_id):
                return True
        Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING).update(status=Delivery.Status.FAILED)
        return False
    except Exception:
        log.exception("alert delivery %s: giving up", delivery_id)
        return False
    finally:
        close_old_connections()
        connection.close()  # a pool thread's own connection: not left open between deliveries


def deliveries_resume() -> list[Future[bool]]:
    """Send again the deliveries still pending from the last hour (the sampler stopped while they were tried)."""
    since = timezone.now() - RESUME_WITHIN
    pending = Delivery.objects.filter(status=Delivery.Status.PENDING, created_at__gte=since)
    return deliveries_send(list(pending.values_list("pk", flat=True)))
