"""channels_redis' pub/sub channel layer, with one fan-out per message for sockets that are waiting.

Channels hands every group message to every member socket through that socket's own queue: per socket, the
payload is deserialised, a receive task wakes and ends, ``asyncio.wait`` wakes the consumer's task, the
handler runs and a new receive task is created: with hundreds of sockets watching many streams, most of the web
process's CPU. Here the layer's reader deserialises a message once and calls each
waiting member's handler itself, in the order the messages came, before it reads the next message.

A socket takes a message directly only when nothing can overtake it or be overtaken: its consumer names
the event type in ``direct_events`` and is not handling anything (``direct_ready()``), and no message of
its is on the queue path. Once one message goes through its queue (a busy socket, another event type),
every later one follows it there until the consumer reports, after handling one, that its queue is empty
(``direct_dispatched``). A queue's emptiness alone is not enough: Channels takes a message off the queue a
task hop before the consumer handles it. So each socket still sees its group messages in publication order.

Everything else (``group_send``, the channel and group names, the wire format, reconnecting) is
channels_redis' own; this module overrides the two places that build the shard connection and its reader.
tests/test_channel_layer.py pins the behaviour against the installed channels_redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer, RedisSingleShardConnection
from channels_redis.utils import _wrap_close, decode_hosts
from django.conf import settings

logger = logging.getLogger(__name__)

# How long one read of the subscription waits for a message before the loop goes round again. A message wakes the
# read at once, whatever this is. channels_redis waits 0.1 s: ten empty reads a second, each through redis-py's
# timeout and retry machinery, are a large share of the idle budget (../shared performance targets: 2 % of a core).
# Subscribing and unsubscribing
# only write to the connection, so they never wait for the read to end.
RECEIVE_WAIT_S = 5.0


class DirectReceiver(Protocol):
    def direct_ready(self, event_type: str) -> bool:
        """True when this socket may take an event of this type now, without its queue."""

    async def direct_deliver(self, event: dict[str, Any]) -> None:
        """Handle the event (shared between sockets: read it, never change it)."""

    def outbox_overflow(self) -> None:
        """Too many events wait for this socket: it is to be closed."""


class FanoutPubSubChannelLayer(RedisPubSubChannelLayer):  # type: ignore[misc]
    def _get_layer(self) -> FanoutLoopLayer:
        loop = asyncio.get_running_loop()
        try:
            layer: FanoutLoopLayer = self._layers[loop]
        except KeyError:
            layer = FanoutLoopLayer(*self._args, **self._kwargs, channel_layer=self)
            self._layers[loop] = layer
            _wrap_close(self, loop)
        return layer


class FanoutLoopLayer(RedisPubSubLoopLayer):  # type: ignore[misc]
    def __init__(self, hosts: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(hosts, *args, **kwargs)
        self._shards = [FanoutShardConnection(host, self) for host in decode_hosts(hosts)]
        self.direct: dict[str, DirectReceiver] = {}  # channel name -> its consumer
        self.queued: set[str] = set()  # channels of direct receivers with a message on the queue path

    def direct_add(self, channel: str, receiver: DirectReceiver) -> None:
        self.direct[channel] = receiver

    def direct_discard(self, channel: str) -> None:
        self.direct.pop(channel, None)
        self.queued.discard(channel)

    def direct_dispatched(self, channel: str) -> None:
        """The consumer has handled a message from its queue. Channels takes the next one off the queue only
        after this, so an empty queue now means none is in flight: direct delivery may resume."""
        queue = self.channels.get(channel)
        if queue is None or queue.empty():
            self.queued.discard(channel)


class FanoutShardConnection(RedisSingleShardConnection):  # type: ignore[misc]
    channel_layer: FanoutLoopLayer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._subscribed = asyncio.Event()  # set by each subscribe: the reader waits for it while nothing is

    async def subscribe(self, channel: str) -> None:
        await super().subscribe(channel)
        self._subscribed.set()

    async def _do_receiving(self) -> None:
        # channels_redis 4.3's loop, with the delivery awaited in it (see _deliver), and a longer wait per read. With
        # no subscription it waits for the next subscribe, where channels_redis sleeps 0.1 s and looks again: the
        # first message after a subscribe to an idle connection (a /v1/ request's turn on a web process with no
        # socket open) could wait up to that sleep.
        while True:
            try:
                if self._pubsub and self._pubsub.subscribed:
                    message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=RECEIVE_WAIT_S)
                    if message is not None:
                        await self._deliver(message)
                else:
                    self._subscribed.clear()
                    if not (self._pubsub and self._pubsub.subscribed):  # still nothing: wait for a subscribe
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(RECEIVE_WAIT_S):
                                await self._subscribed.wait()
            except (TimeoutError, asyncio.CancelledError, GeneratorExit):
                raise
            except BaseException:
                logger.exception("Unexpected exception in receive task")
                await asyncio.sleep(1)

    async def _deliver(self, message: dict[str, Any]) -> None:
        layer = self.channel_layer
        name = message["channel"]
        if isinstance(name, bytes):
            name = name.decode()
        members = layer.groups.get(name)
        if not layer.direct or not members or name in layer.channels:
            if name in layer.direct:
                layer.queued.add(name)  # a message to one channel: it holds that socket's later ones behind it
            self._receive_message(message)
            return
        data = message["data"]
        event: dict[str, Any] | None = None
        for channel in tuple(members):  # a handler may await; a socket may leave the group meanwhile
            queue = layer.channels.get(channel)
            if queue is None:
                continue
            receiver = layer.direct.get(channel)
            if receiver is not None:
                if channel not in layer.queued and queue.empty():
                    if event is None:
                        event = layer.channel_layer.deserialize(data)
                    if receiver.direct_ready(event.get("type", "")):
                        try:
                            await receiver.direct_deliver(event)
                        except Exception:
                            logger.exception("Delivering %s to %s failed", event.get("type"), channel)
                        continue
                layer.queued.add(channel)
            if queue.qsize() >= settings.WS_OUTBOX_MAX:  # a socket that cannot keep up: closed, never a memory sink
                _overflow(queue, receiver)
                continue
            queue.put_nowait(data)


def _overflow(queue: asyncio.Queue[Any], receiver: Any) -> None:
    """Drop a socket's waiting events and have it closed (``outbox_overflow``: the page reconnects and resyncs)."""
    while not queue.empty():
        queue.get_nowait()
    if receiver is not None:
        receiver.outbox_overflow()


# The layers whose group_send is a PUBLISH to ``<prefix>__group__<group>`` (channels_redis' own naming rule).
PUBSUB_LAYERS = ("rigdash.channel_layer.FanoutPubSubChannelLayer", "channels_redis.pubsub.RedisPubSubChannelLayer")


def group_channel(group: str) -> str | None:
    """The Redis pub/sub channel of ``group``, when the configured layer is a pub/sub layer on ``settings.REDIS_URL``
    alone (no encryption); None otherwise. tests/test_bench_pipeline.py checks it against the installed
    channels_redis."""
    config: dict[str, Any] = settings.CHANNEL_LAYERS.get("default", {})
    if config.get("BACKEND") not in PUBSUB_LAYERS:
        return None
    options: dict[str, Any] = config.get("CONFIG", {})
    if options.get("hosts") != [settings.REDIS_URL] or options.get("symmetric_encryption_keys"):
        return None
    return f"{options.get('prefix', 'asgi')}__group__{group}"


def publication(group: str, message: Mapping[str, Any]) -> tuple[str, bytes] | None:
    """The channel and the bytes ``group_send(group, message)`` would publish (see ``group_channel``)."""
    channel = group_channel(group)
    return None if channel is None else (channel, get_channel_layer().serialize(message))
