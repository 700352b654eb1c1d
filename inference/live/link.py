"""The worker's per-batch Redis writes, on one connection of their own, in as few round trips as the turns allow.

Every batch a streaming turn sends is RPUSH to the turn's live list, PUBLISH to its session's group, and every
100 ms a GET of the cancel flag (inference/worker/stream.py, ``TurnStream.flush``). The turns on one worker loop
share one ``redis.asyncio`` connection used directly (commands packed together, replies read in order), without
redis-py's ``Pipeline``, whose pool checkout, health checks and bookkeeping would run on every batch.

The batches of several turns go out together: ``execute`` queues its commands and one sender writes everything
queued in one packed write and reads the replies in order. What queues while a round trip is on its way goes in the
next one, and the turns' batches due at one flush tick (inference/worker/pace.py) are queued in one pass of the loop,
before the sender runs: sixteen turns at one tick cost one write, one read and one wake-up of Redis, not sixteen.

A caller gets its own replies, in order. An error reply (WRONGTYPE) fails the caller whose command it answers and
no other; the replies after it are still read, so the connection stays in step. A caller cancelled while its round
trip is on its way stops waiting; its commands have run, and their replies are read and dropped. A dropped connection
fails every caller of that round trip with the error; the next round trip opens a new connection. What this gives up:
redis-py's retry of a command on a new connection: the stream keeps its tokens, tries again a quarter second later
(``REDIS_RETRY_S``) and rebuilds the live list whole if Redis lost it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

Command = tuple[Any, ...]


class RedisLink:
    """One Redis connection for one event loop's batch writes: ``pipeline()`` then ``execute()``, as with redis-py,
    for the few commands a batch needs. The connection is opened on first use and again after any failure."""

    def __init__(self, url: str) -> None:
        # The pool is only the URL's parser and the connection's factory (host, port, db, password, TLS, socket
        # path): its connection is never handed back to it.
        self._connection: AbstractConnection = ConnectionPool.from_url(url).make_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        self._queued: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.round_trips = 0  # how many packed writes went out (tests/test_redislink.py reads it)

    def pipeline(self, transaction: bool = False) -> LinkPipeline:
        if transaction:
            raise ValueError("a RedisLink sends its commands as they are, without MULTI/EXEC")
        return LinkPipeline(self)

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send the commands (with whatever else is queued) and return their replies in order, as Redis sent them
        (bytes and integers: none of redis-py's response callbacks, so EXPIRE's reply is 1, not True). Raises what
        redis-py raises: a ``ResponseError`` for an error reply to one of these commands, a ``RedisError`` or
        ``OSError`` when the connection failed."""
        if not commands:
            return []
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._queued.append((commands, future))
        if self._sender is None or self._sender.done():
            # The sender's first step runs after every callback already due in this pass of the loop: batches due
            # at the same tick are queued by then and go in one write.
            self._sender = asyncio.create_task(self._send())
        return await future

    async def _send(self) -> None:
        connection = self._connection
        while self._queued:
            group, self._queued = self._queued, []
            group = [(commands, future) for commands, future in group if not future.cancelled()]
            if not group:
                continue
            flat = [command for commands, _ in group for command in commands]
            try:
                await connection.send_packed_command(connection.pack_commands(flat), check_health=False)
                self.round_trips += 1
                replies = [await _reply(connection) for _ in flat]
            except Exception as exc:  # a dropped connection: every caller of this round trip gets the error
                await connection.disconnect(nowait=True)
                _fail(group, exc)
                continue
            except BaseException:  # this task cancelled (the loop is closing): nobody is left waiting
                await connection.disconnect(nowait=True)
                _fail([*group, *self._queued], RedisConnectionError("the link's round trip was cancelled"))
                self._queued = []
                raise
            start = 0
            for commands, future in group:
                mine = replies[start : start + len(commands)]
                start += len(commands)
                if future.done():  # its caller was cancelled: the replies are read and dropped
                    continue
                error = next((reply for reply in mine if isinstance(reply, ResponseError)), None)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(mine)

    async def aclose(self) -> None:
        if self._sender is not None and not self._sender.done():
            await asyncio.gather(self._sender, return_exceptions=True)
        await self._connection.disconnect()


def _fail(group: Sequence[tuple[Sequence[Command], asyncio.Future[list[Any]]]], error: Exception) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(error)


async def _reply(connection: AbstractConnection) -> Any:
    """One reply; an error reply is returned (it was read whole, so the connection stays in step), not raised."""
    try:
        return await connection.read_response()
    except ResponseError as error:
        return error


class LinkPipeline:
    """The commands of one batch, collected as redis-py's pipeline collects them (only those the worker uses)."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._commands: list[Command] = []

    async def __aenter__(self) -> LinkPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._commands.clear()

    def rpush(self, key: str, *values: str | bytes) -> LinkPipeline:
        self._commands.append(("RPUSH", key, *values))
        return self

    def delete(self, *keys: str) -> LinkPipeline:
        self._commands.append(("DEL", *keys))
        return self

    def expire(self, key: str, seconds: int) -> LinkPipeline:
        self._commands.append(("EXPIRE", key, seconds))
        return self

    def publish(self, channel: str | bytes, message: str | bytes) -> LinkPipeline:
        self._commands.append(("PUBLISH", channel, message))
        return self

    def command(self, *args: Any) -> LinkPipeline:
        """Any other command, as Redis spells it (``("SET", key, value, "EX", 60)``)."""
        self._commands.append(args)
        return self

    def get(self, key: str) -> LinkPipeline:
        self._commands.append(("GET", key))
        return self

    async def execute(self) -> list[Any]:
        commands, self._commands = self._commands, []
        return await self._link.execute(commands)
