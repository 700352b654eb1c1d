"""A rig added, disabled or deleted from the board: a running worker consumes its queue, or stops, without a restart
(inference/worker/queues.py). A real Celery worker, started as ./scripts/run starts its one (it consumes the
default queue, here a queue of this test's own so that the suite's worker is not involved)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from rigdash.launcher import Stack, worker_command
from tests.conftest import LOG_DIR, wait_until


def _consumed(worker: str) -> set[str]:
    from rigdash.celery import app

    replies = app.control.inspect(timeout=0.5, destination=[worker]).active_queues() or {}
    return {queue["name"] for queue in replies.get(worker, [])}


@pytest.mark.django_db(transaction=True)
def test_a_rig_saved_or_deleted_moves_the_running_workers_queues(service_env: dict[str, str], settings: Any) -> None:
    from inference.models import Rig
    from inference.worker import queues
    from rigdash.celery import app

    default = f"wtq{os.getpid()}.default"
    name = f"follow{os.getpid()}@localhost"
    processes = Stack()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = {**service_env, "RIGDASH_WORKERS_FOLLOW_RIGS": "1", "RIGDASH_DEFAULT_QUEUE": default}
    processes.start(
        "follow-worker",
        worker_command(queues=[default], concurrency=1, name=name, beat_schedule=None),
        env=env,
        log_path=LOG_DIR / "follow-worker.log",
    )
    try:
        deadline = time.monotonic() + 60
        while not any(name in reply for reply in app.control.ping(timeout=0.5, destination=[name])):
            assert time.monotonic() < deadline, f"worker did not answer; see {LOG_DIR / 'follow-worker.log'}"
        settings.CELERY_TASK_DEFAULT_QUEUE = default  # the signal's task goes to the following worker
        settings.RIGDASH_WORKERS_FOLLOW_RIGS = True
        rig = Rig.objects.create(name=f"added{os.getpid()}", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9")
        assert rig.queue == f"rig.added{os.getpid()}"
        # On the commit of the save: no restart, no periodic pass.
        wait_until(lambda: rig.queue in _consumed(name), timeout_s=20, what="the worker to consume the new rig's queue")
        rig.enabled = False
        rig.save()
        wait_until(lambda: rig.queue not in _consumed(name), timeout_s=20, what="the worker to drop a disabled rig")
        rig.enabled = True
        rig.save()
        wait_until(lambda: rig.queue in _consumed(name), timeout_s=20, what="the worker to take the rig back")
        queue = rig.queue
        rig.delete()
        wait_until(lambda: queue not in _consumed(name), timeout_s=20, what="the worker to drop a deleted rig")
        assert default in _consumed(name)  # its own queue stays
        # The periodic pass (a missed broadcast): a rig whose save sent nothing is found.
        Rig.objects.bulk_create([Rig(name=f"quiet{os.getpid()}", kind=Rig.Kind.LLAMACPP, base_url="http://x:9",
                                     queue=f"rig.quiet{os.getpid()}")])  # fmt: skip
        done = queues.reconcile()
        assert done.added == {f"rig.quiet{os.getpid()}": [name]}, done
        wait_until(lambda: f"rig.quiet{os.getpid()}" in _consumed(name), timeout_s=10, what="the periodic pass")
    finally:
        processes.stop()


@pytest.mark.django_db
def test_reconcile_tells_nobody_when_following_is_off(settings: Any) -> None:
    from inference.worker import queues

    settings.RIGDASH_WORKERS_FOLLOW_RIGS = False
    assert queues.reconcile() == queues.Reconciled()
