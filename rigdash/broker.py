"""Celery's Redis transport, with one redis-py client object per channel for the commands it sends.

kombu's Redis channel builds a new redis-py client object for each command it sends outside its consumer loop
(``Channel.conn_or_acquire``): every publish, queue length and ack. redis-py 6 fills its response-callback tables
for each new client, a large share of an ``apply_async``'s CPU (``python -m bench.publish`` measures it), which a
submit pays on the way to the turn's first token. A client object holds no connection of
its own: it takes one from the channel's pool for each command and gives it back, and redis-py documents it as safe
to share between threads (pipelines, which are not, are still made per use). So the channel keeps one.

Used for ``redis://`` and ``rediss://`` (TLS) brokers (settings.CELERY_BROKER_TRANSPORT); any other URL gets kombu's
own transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    _command_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._command_client is None:
            create: Any = self._create_client  # kombu's, untyped
            self._command_client = create()
        yield self._command_client


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
