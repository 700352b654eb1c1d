"""A child process that ends with its parent, even when the parent is killed with SIGKILL (as the OOM killer does):
the rig agent's Celery worker (monitoring/management/commands/rigdash_agent.py).

Two mechanisms, either enough:

1. On Linux the child asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, set between
   fork and exec by ``die_with_parent``): https://man7.org/linux/man-pages/man2/pr_set_pdeathsig.2const.html
2. Everywhere, the child's own watchdog thread (``watch_parent``, started from ``RIGDASH_PARENT_PID`` by
   rigdash/celery.py) sees its parent change within a second and sends itself SIGTERM.

SIGTERM is Celery's warm shutdown (running tasks finish; unstarted ones go back to the queue, acks are late); the
watchdog sends SIGKILL after ``GRACE_S`` if the process is still there, as the agent's own stop does.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PARENT_ENV = "RIGDASH_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
GRACE_S = 20.0  # what the agent gives its worker on a normal stop


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when ``parent_pid`` dies (Linux; elsewhere
    nothing, and ``watch_parent`` alone covers it). The kernel tracks the thread that forked: fork from the main
    thread, which lives as long as the process."""

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the request reached the kernel
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def watch_parent(parent_pid: int, *, interval_s: float = 1.0, grace_s: float = GRACE_S) -> threading.Thread:
    """A daemon thread that sends this process SIGTERM once its parent is no longer ``parent_pid`` (it died and the
    process was re-parented), then SIGKILL after ``grace_s``."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        log.warning("parent process %s is gone: stopping (SIGTERM, SIGKILL after %g s)", parent_pid, grace_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def watch_parent_from_env() -> threading.Thread | None:
    """``watch_parent`` for the pid in RIGDASH_PARENT_PID, when the process that started this one set it."""
    raw = os.environ.get(PARENT_ENV, "").strip()
    if not raw.isdigit():
        return None
    return watch_parent(int(raw))


def child_env(parent_pid: int) -> dict[str, str]:
    """The environment of a child that must end with ``parent_pid``: this one, naming it."""
    return {**os.environ, PARENT_ENV: str(parent_pid)}
