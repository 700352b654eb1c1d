"""What a transaction does once it commits, and the web's way of running that off its database thread.

``on_commit`` is ``transaction.on_commit``, except where the calling thread is inside ``collected()``: there the
work is kept, in order, once the transaction commits (and dropped with it if it rolls back, as Django drops its
own), and the caller runs it later with ``run``.

Why: the web's chat sockets store their submits on Channels' one database thread (``inference/submits.py``). A
stored turn's commit work (the page's turn.queued, the Celery message, the queue positions, the board) took
4-24 ms there under level 3's fan-out, and the next burst's transaction waited for it (docs/benchmarks.md,
"Where targets are still missed", item 7). Collected, it runs on a thread of its own while the next burst is
stored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import close_old_connections, transaction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hook:
    func: Callable[[], object]
    robust: bool  # as Django's: an error is logged and the next hook still runs


_local = threading.local()


def on_commit(func: Callable[[], object], *, robust: bool = False) -> None:
    """``transaction.on_commit(func, robust=robust)``, or, inside ``collected()`` on this thread, kept for its
    caller once the transaction commits."""
    hooks: list[Hook] | None = getattr(_local, "hooks", None)
    if hooks is None:
        transaction.on_commit(func, robust=robust)
    else:
        hook = Hook(func, robust)
        transaction.on_commit(lambda: hooks.append(hook))


@contextmanager
def collected() -> Iterator[list[Hook]]:
    """The commit work of the transactions that commit inside this block, on this thread: to run with ``run``."""
    hooks: list[Hook] = []
    outer = getattr(_local, "hooks", None)
    _local.hooks = hooks
    try:
        yield hooks
    finally:
        _local.hooks = outer


def run(hooks: list[Hook]) -> None:
    """Run collected hooks in order, as Django runs its own after a commit: a robust hook's error is logged, and
    the first other error stops the rest and is raised.

    For a thread of the caller's own: database connections are checked before and after, as Channels'
    ``database_sync_to_async`` does (a hook may read or write, on this thread's own connection)."""
    close_old_connections()
    try:
        for hook in hooks:
            if not hook.robust:
                hook.func()
                continue
            try:
                hook.func()
            except Exception:
                log.exception("a robust commit hook failed: %r", hook.func)
    finally:
        close_old_connections()
