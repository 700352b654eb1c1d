"""Chat sockets' submits, stored in bursts.

Every chat socket of a web process stores its turns through Channels' one database thread
(``database_sync_to_async``), so submits stored one by one would queue behind each other. Here a submit that
arrives while a store is running waits for that store to end and then goes together with every other submit that
arrived meanwhile: one transaction, one dispatch, one round trip of announcements
(``inference.turns.submit.turn_submit_many``). A lone submit goes at once; nothing is held
back on a timer to collect a batch.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from channels.db import database_sync_to_async
from django.db import DatabaseError

from inference.models import Turn
from inference.turns import submit as submits


class SubmitQueue:
    """The submits of one event loop's sockets, drained by one task at a time."""

    def __init__(self) -> None:
        self._waiting: list[tuple[submits.SubmitRequest, asyncio.Future[Turn]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, request: submits.SubmitRequest) -> Turn:
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
                    results = await database_sync_to_async(submits.turn_submit_many)([r for r, _ in batch])
                except DatabaseError as exc:  # the transaction rolled back: nothing of the burst is stored
                    # One submit's failure never touches another's: each is stored again on its own.
                    results = await self._one_by_one([r for r, _ in batch]) if len(batch) > 1 else [exc]
                except Exception as exc:  # Redis or the broker failed: every submit in the batch hears it
                    results = [exc] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():  # its socket went away; the turn is stored all the same
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._drainer = None

    @staticmethod
    async def _one_by_one(requests: list[submits.SubmitRequest]) -> list[Any]:
        results: list[Any] = []
        for request in requests:
            try:
                results.extend(await database_sync_to_async(submits.turn_submit_many)([request]))
            except Exception as exc:
                results.append(exc)
        return results


_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SubmitQueue] = weakref.WeakKeyDictionary()


async def submit(*, user: Any, session_id: int, text: Any, params: Any = None) -> Turn:
    """Store a chat socket's new turn through its event loop's submit queue."""
    loop = asyncio.get_running_loop()
    queue = _queues.get(loop)
    if queue is None:
        queue = _queues[loop] = SubmitQueue()
    return await queue.submit(submits.SubmitRequest(user=user, session_id=session_id, text=text, params=params))
