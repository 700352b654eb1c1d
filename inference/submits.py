"""Chat sockets' submits, stored in bursts.

Every chat socket of a web process stores its turns through Channels' one database thread
(``database_sync_to_async``). When sixteen pages sent at once, each submit was stored on its own, 9-27 ms
apiece under load, and the last page's turn waited about 300 ms before it was even stored
(docs/benchmarks.md, level 3). Here a submit that arrives while a store is running waits for that store to
end and then goes together with every other submit that arrived meanwhile: one transaction, one dispatch,
one round trip of announcements (``services.turn_submit_many``). A lone submit goes at once; nothing is held
back on a timer to collect a batch.

A stored batch's commit work (the pages' turn.queued, the Celery message, the queue positions, the board) does
not run on the database thread: it runs on a thread of its own, one batch after another in order, while the
database thread stores the next batch (``inference/aftercommit.py``). A submit's answer waits for its batch's
commit work, so a socket still hears that the task queue is down (``dispatch.QueueUnavailable``).
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async

from inference import aftercommit, services
from inference.models import Turn


class SubmitQueue:
    """The submits of one event loop's sockets, drained by one task at a time."""

    def __init__(self) -> None:
        self._waiting: list[tuple[services.SubmitRequest, asyncio.Future[Turn]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._answering: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references

    async def submit(self, request: services.SubmitRequest) -> Turn:
        """Store the turn (with whatever else is waiting); raises its own InvalidInput or Http404."""
        future: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results, done = await database_sync_to_async(_store)([r for r, _ in batch])
                except Exception as exc:  # the database failed: every submit in the batch hears it
                    _answer(batch, [exc] * len(batch))
                    continue
                answering = asyncio.create_task(_answer_after(asyncio.wrap_future(done), batch, results))
                self._answering.add(answering)
                answering.add_done_callback(self._answering.discard)
        finally:
            self._drainer = None


def _store(requests: list[services.SubmitRequest]) -> tuple[list[Turn | Exception], Future[None]]:
    """On the database thread: the batch's transaction, and its commit work handed to the commit thread from here
    (batches commit in order on this one thread, so their work queues in that order, without a hop through the
    event loop first)."""
    with aftercommit.collected() as hooks:
        results: list[Turn | Exception] = list(services.turn_submit_many(requests))
    return results, _commit_thread.submit(aftercommit.run, hooks)


async def _answer_after(
    done: asyncio.Future[None], batch: list[tuple[services.SubmitRequest, asyncio.Future[Turn]]], results: list[Any]
) -> None:
    """Answer the batch's submits once its commit work ran. If it failed (the task queue is down), every turn the
    batch stored hears it; a refused submit keeps its own error."""
    try:
        await done
    except Exception as exc:
        results = [exc if isinstance(result, Turn) else result for result in results]
    _answer(batch, results)


def _answer(batch: list[tuple[services.SubmitRequest, asyncio.Future[Turn]]], results: list[Any]) -> None:
    for (_, future), result in zip(batch, results, strict=True):
        if future.done():  # its socket went away; the turn is stored all the same
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


# One thread, so that batches' commit work runs in the order they committed (a page hears of its turn before its
# task is sent, and one batch's messages before the next's).
_commit_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rigdash-commit-work")


_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SubmitQueue] = weakref.WeakKeyDictionary()


async def submit(*, user: Any, session_id: int, text: Any, params: Any = None) -> Turn:
    """Store a chat socket's new turn through its event loop's submit queue."""
    loop = asyncio.get_running_loop()
    queue = _queues.get(loop)
    if queue is None:
        queue = _queues[loop] = SubmitQueue()
    return await queue.submit(services.SubmitRequest(user=user, session_id=session_id, text=text, params=params))
