"""One long-lived asyncio loop per worker process, so streaming turns reuse connections across tasks, and that
loop's Redis connections.

The worker's pool is threads (settings.CELERY_WORKER_POOL): every task thread hands its turn to this one loop.
Under a prefork pool the children are forked: the loop thread is started lazily and again after a fork.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis.asyncio as aioredis
from django.conf import settings

from inference.live.link import RedisLink

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
    """Start ``coro`` on this process's loop thread; its future gives the result (and cancels it). Called on that
    thread (the early lane's listener), its task is made at once, not a loop turn later through the thread-safe
    queue."""
    target = _worker_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not target:
        return asyncio.run_coroutine_threadsafe(coro, target)
    task = target.create_task(coro)
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def settle(done: asyncio.Task[T]) -> None:
        if future.cancelled():  # cancelled from outside while it ended
            return
        if done.cancelled():
            future.cancel()
        elif (exc := done.exception()) is not None:
            future.set_exception(exc)
        else:
            future.set_result(done.result())

    task.add_done_callback(settle)
    future.add_done_callback(lambda f: target.call_soon_threadsafe(task.cancel) if f.cancelled() else None)
    return future


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this process's loop thread and wait for its result (from synchronous code)."""
    return start(coro).result()


_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RedisLink] = weakref.WeakKeyDictionary()


def redis_for_loop() -> aioredis.Redis:
    """The running loop's Redis client, for the board's progress (a batch's writes go through ``link_for_loop``)."""
    loop = asyncio.get_running_loop()
    client = _redis_clients.get(loop)
    if client is None:
        client = _redis_clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL)
    return client


def link_for_loop() -> RedisLink:
    """The running loop's connection for batch writes (the worker runs every turn on one loop)."""
    loop = asyncio.get_running_loop()
    link = _links.get(loop)
    if link is None:
        link = _links[loop] = RedisLink(settings.REDIS_URL)
    return link
