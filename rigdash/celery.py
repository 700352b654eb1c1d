"""The Celery app: Redis broker, settings from Django's CELERY_* names, one queue per rig."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init, worker_process_init, worker_ready
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")

app = Celery("rigdash")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def preload_before_fork(**_: Any) -> None:
    """Import and build at start what a worker's first turns would otherwise do while the user waits: httpx's
    async stack (anyio, imported lazily on first use), the IDNA codec, the TLS context and the channel layer
    (channels_redis, imported at the first turn's first message to its page, while llama-server reads that turn's
    prompt). Under a prefork pool this runs in the parent, before the fork, so no child imports them again."""
    import contextlib
    import encodings.idna  # noqa: F401
    import importlib

    for module in ("anyio._backends._asyncio", "httpcore._async", "httpcore._backends.anyio"):
        with contextlib.suppress(ImportError):  # another httpx/anyio layout: the child imports what it needs
            importlib.import_module(module)
    from inference.backends.llamacpp import chat as llamacpp
    from inference.worker import pace
    from rigdash import channel_layer, cpushare  # noqa: F401

    llamacpp.tls_context()
    # The CPU split hears when replies start and stop streaming (rigdash/cpushare.py). Registered before any fork,
    # so a prefork pool's children have it too; each process opens its own signal when it first streams.
    pace.streaming_listeners.append(lambda step: cpushare.worker_signal().streams(step))


@worker_init.connect
def end_with_the_agent(**_: Any) -> None:
    """A worker a rig agent started ends with it, even when the agent is killed outright (rigdash/parentwatch.py)."""
    from rigdash import parentwatch

    parentwatch.watch_parent_from_env()


@worker_ready.connect
@worker_process_init.connect
def keep_startup_out_of_collections(**_: Any) -> None:
    """The worker (or a prefork child) has loaded what it runs turns with: keep it out of full collections, so a
    collection during a reply does not stall its tokens (rigdash/gcpolicy.py)."""
    from rigdash import gcpolicy

    gcpolicy.settle("worker")


@task_prerun.connect
@task_postrun.connect
def close_stale_connections(**_: Any) -> None:
    """Around each task, close this thread's database connections that are past CONN_MAX_AGE or broken, as Django
    does around a request. Celery's fix-up would close them all (settings.CELERY_DB_REUSE_MAX says why not)."""
    close_old_connections()


@worker_ready.connect
def reconcile_rig_queues(**_: Any) -> None:
    """A worker that follows the rigs (it consumes the default queue) takes every enabled rig's queue that no worker
    consumes: a rig added while no worker ran (inference/worker/queues.py). Sent, not run here: the broadcast's
    answers need this worker's consumer running."""
    import contextlib

    from inference.worker import queues

    with contextlib.suppress(Exception):  # no broker yet: the beat's periodic pass does it
        queues.reconcile_soon()


@worker_ready.connect
def take_early_tickets(sender: Any = None, **_: Any) -> None:
    """Take early tickets for the rig queues this worker consumes (inference/worker/early.py), where its tasks run in
    this process (the thread or solo pool)."""
    from inference.worker import start

    pool = type(getattr(sender, "pool", None)).__module__
    if not pool.endswith((".thread", ".solo")):
        return

    def consumed() -> list[str]:
        task_consumer = getattr(sender, "task_consumer", None)  # None while the worker reconnects
        return [queue.name for queue in getattr(task_consumer, "queues", None) or ()]

    start.early_lane_listen(consumed)
