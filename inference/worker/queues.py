"""Which rig queues the running workers consume, kept in step with the rigs without a restart.

A worker consumes the queues it was started with (``-Q``). A rig added from the board (/board/rigs/new) has a queue
no worker was started with, so its turns would wait until a restart. ``reconcile`` asks the workers what they consume
(one broadcast) and tells the workers that follow the rigs, those consuming the default queue (``./scripts/run``'s
one worker, compose's ``worker`` service), to consume every enabled rig's queue that no worker consumes
(``add_consumer``), and to stop consuming the queue of a rig deleted or disabled (``cancel_consumer``). A worker
started for one rig (``-Q rig.<name>`` alone) is never told anything. ``RIGDASH_WORKERS_FOLLOW_RIGS=0`` turns it off.

It runs on every rig save or delete (inference/signals.py, after the commit), when a worker is ready
(rigdash/celery.py) and every ``RIGDASH_QUEUES_RECONCILE_S`` from the beat, for a broadcast that was missed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery import current_app
from django.conf import settings

from inference.models import Rig

log = logging.getLogger(__name__)

TASK = "inference.worker_queues_reconcile"
RIG_QUEUE_PREFIX = "rig."


@dataclass
class Reconciled:
    added: dict[str, list[str]] = field(default_factory=dict)  # queue -> the workers told to consume it
    cancelled: dict[str, list[str]] = field(default_factory=dict)  # queue -> the workers told to stop
    error: str = ""


def reconcile(*, timeout_s: float = 1.0) -> Reconciled:
    app = current_app
    default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    result = Reconciled()
    if not settings.RIGDASH_WORKERS_FOLLOW_RIGS:
        return result
    try:
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception as exc:
        result.error = f"could not ask the workers: {exc!r}"
        log.warning(result.error)
        return result
    by_worker = {
        worker: {str(queue.get("name")) for queue in queues if isinstance(queue, dict)}
        for worker, queues in replies.items()
        if isinstance(queues, list)
    }
    followers = sorted(worker for worker, queues in by_worker.items() if default_queue in queues)
    if not followers:
        return result
    rigs = list(Rig.objects.values_list("queue", "enabled"))
    wanted = {queue for queue, enabled in rigs if enabled and queue}
    known = {queue for queue, _ in rigs if queue}
    consumed = set().union(*by_worker.values())
    for queue in sorted(wanted - consumed):
        app.control.add_consumer(queue, destination=followers, reply=True, timeout=timeout_s)
        result.added[queue] = followers
    for worker in followers:
        for queue in sorted(by_worker[worker]):
            rig_queue = queue in known or queue.startswith(RIG_QUEUE_PREFIX)
            if queue != default_queue and rig_queue and queue not in wanted:
                app.control.cancel_consumer(queue, destination=[worker], reply=True, timeout=timeout_s)
                result.cancelled.setdefault(queue, []).append(worker)
    if result.added or result.cancelled:
        log.info("worker queues: added %s, cancelled %s", result.added, result.cancelled)
    return result


def reconcile_soon() -> None:
    """Ask a worker to reconcile (the task, on the default queue): a page saving a rig does not wait on the
    broadcast. Without a broker the beat's periodic pass does it later."""
    current_app.send_task(TASK, queue=settings.CELERY_TASK_DEFAULT_QUEUE)
