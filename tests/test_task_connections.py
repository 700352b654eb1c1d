"""A Celery task thread keeps its database connection between tasks, and still drops one past its age.

Celery's Django fix-up (the real one, as the worker installs it at start) listens to ``task_prerun`` and
``task_postrun``. The worker sends those in the task's thread; here the test sends them by hand in its own thread,
around a real statement on the test database, because the test worker runs with CONN_MAX_AGE=0 (so that the test
database can be dropped) and would close every connection anyway.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import beat_embedded_init, task_postrun, task_prerun, worker_process_init
from django.db import connection

from inference.models import Rig
from inference.tasks import dispatch_all_task
from rigdash.celery import app


@pytest.fixture
def worker_fixup() -> Iterator[DjangoWorkerFixup]:
    fixup = DjangoWorkerFixup(app).install()
    try:
        yield fixup
    finally:  # everything install() connected: this process is no worker
        task_prerun.disconnect(fixup.on_task_prerun)
        task_postrun.disconnect(fixup.on_task_postrun)
        beat_embedded_init.disconnect(fixup.close_database)
        worker_process_init.disconnect(fixup.on_worker_process_init)


def _run_task_body() -> None:
    task_prerun.send(sender=dispatch_all_task, task_id="t", task=dispatch_all_task, args=(), kwargs={})
    Rig.objects.count()  # the task's statement
    task_postrun.send(sender=dispatch_all_task, task_id="t", task=dispatch_all_task, args=(), kwargs={}, retval=None)


@pytest.mark.django_db(transaction=True)
def test_a_task_thread_reuses_its_connection_until_it_is_too_old(worker_fixup, monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    connection.ensure_connection()
    first = connection.connection
    for _ in range(5):  # the beat's dispatch every 5 s, for 25 s
        _run_task_body()
    assert connection.connection is first, "a task closed its thread's connection"

    connection.close_at = time.monotonic() - 1  # past CONN_MAX_AGE
    task_prerun.send(sender=dispatch_all_task, task_id="t", task=dispatch_all_task, args=(), kwargs={})
    assert connection.connection is None, "a connection past its age outlived a task"


def test_a_starting_worker_imports_what_its_first_turn_would_import_while_the_user_waits():
    """``worker_init`` (rigdash/celery.py) preloads what a first turn would otherwise import during its prompt: the
    channel layer among it (16 ms of CPU here, competing with llama-server for the prompt). Run in a fresh
    interpreter, where nothing is imported yet."""
    import subprocess
    import sys

    from django.conf import settings

    script = (
        "import sys, django; django.setup(); import rigdash.celery as c, inference.tasks;"
        "before = 'rigdash.channel_layer' in sys.modules; c.preload_before_fork();"
        "print(before, 'rigdash.channel_layer' in sys.modules, 'anyio._backends._asyncio' in sys.modules)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rigdash.settings"}
    out = subprocess.run([sys.executable, "-c", script], cwd=settings.BASE_DIR, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]
