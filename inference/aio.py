"""One long-lived asyncio loop per worker process, so streaming turns reuse connections across tasks.

The worker's pool is threads (settings.CELERY_WORKER_POOL): every task thread hands its turn to this one loop.
Under a prefork pool the children are forked: the loop thread is started lazily and again after a fork.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None


def _worker_loop() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rigdash-aio", daemon=True)
            thread.start()
            _loop, _pid = loop, os.getpid()
        return _loop


def start(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on this process's loop thread (from synchronous code); its future gives the result."""
    return asyncio.run_coroutine_threadsafe(coro, _worker_loop())


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this process's loop thread and wait for its result (from synchronous code)."""
    return start(coro).result()
