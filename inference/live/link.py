"""The worker's per-batch Redis writes, on one connection of their own.

Every batch a streaming turn sends is one round trip to Redis: RPUSH to the turn's live list, PUBLISH to its
session's group, and every 100 ms a GET of the cancel flag (inference/worker/stream.py, ``TurnStream.flush``). It
goes through one ``redis.asyncio`` connection used directly (commands packed together, replies read in order),
without redis-py's ``Pipeline``, whose pool checkout, health checks and bookkeeping would run on every batch, and a
batch often holds one token.

What this gives up: redis-py's retry of a command on a new connection. A batch that meets a dropped connection
fails as a whole; the stream keeps its tokens, tries again a quarter second later (``REDIS_RETRY_S``) on a new
connection, and rebuilds the live list whole if Redis lost it. The turns on one loop share the connection and take
turns on it: their batches are each one round trip to a single-threaded server anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool

Command = tuple[Any, ...]


class RedisLink:
    """One Redis connection for one event loop's batch writes: ``pipeline()`` then ``execute()``, as with redis-py,
    for the few commands a batch needs. The connection is opened on first use and again after any failure."""

    def __init__(self, url: str) -> None:
        # The pool is only the URL's parser and the connection's factory (host, port, db, password, TLS, socket
        # path): its connection is never handed back to it.
        self._connection: AbstractConnection = ConnectionPool.from_url(url).make_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        self._lock = asyncio.Lock()

    def pipeline(self, transaction: bool = False) -> LinkPipeline:
        if transaction:
            raise ValueError("a RedisLink sends its commands as they are, without MULTI/EXEC")
        return LinkPipeline(self)

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send the commands together and return their replies in order, as Redis sent them (bytes and integers:
        none of redis-py's response callbacks, so EXPIRE's reply is 1, not True). Raises what redis-py raises (a
        ``RedisError`` or ``OSError``); the connection is then closed, never reused with replies left unread."""
        if not commands:
            return []
        async with self._lock:
            connection = self._connection
            try:
                await connection.send_packed_command(connection.pack_commands(commands), check_health=False)
                return [await connection.read_response() for _ in commands]
            except BaseException:  # an error reply, a dropped connection, or the task cancelled mid-way
                await connection.disconnect(nowait=True)
                raise

    async def aclose(self) -> None:
        async with self._lock:
            await self._connection.disconnect()


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
