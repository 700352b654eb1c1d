"""rigdash.channel_layer against the installed channels_redis and the real Redis: a group message reaches every
idle socket once, straight from the layer's reader, and no socket ever sees its messages out of order."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from inference import events
from rigdash.channel_layer import FanoutPubSubChannelLayer

_prefixes = itertools.count()


class Receiver:
    """A socket as the layer sees it; ``ready`` plays its consumer being idle or busy."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[dict[str, Any]] = []
        self.ready = True
        self.fail = fail

    def direct_ready(self, event_type: str) -> bool:
        return self.ready and event_type == "x.token"

    async def direct_deliver(self, event: dict[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("this socket's send failed")
        self.events.append(event)


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.005)


async def _layer_with_group(*receivers: Receiver) -> tuple[Any, list[str]]:
    """A fresh layer with one channel per receiver in group "g", subscribed for certain: a probe (not a direct
    type) is published until every channel's queue holds it, then the queues are emptied and handled."""
    layer = FanoutPubSubChannelLayer(hosts=[settings.REDIS_URL], prefix=f"fanout{os.getpid()}x{next(_prefixes)}")
    channels = []
    for receiver in receivers:
        channel = await layer.new_channel()
        await layer.group_add("g", channel)
        layer.direct_add(channel, receiver)
        channels.append(channel)
    queues = [layer._get_layer().channels[c] for c in channels]  # channels_redis internals: each channel's queue
    for _ in range(200):
        await layer.group_send("g", {"type": "probe"})
        await asyncio.sleep(0.01)
        if all(not q.empty() for q in queues):
            break
    else:
        pytest.fail("the layer never heard its own group")
    for channel, q in zip(channels, queues, strict=True):
        while not q.empty():
            q.get_nowait()
        layer.direct_dispatched(channel)  # as a consumer does after handling what its queue held
    return layer, channels


async def test_a_message_is_deserialised_once_and_handed_to_every_idle_socket() -> None:
    a, b = Receiver(), Receiver()
    layer, channels = await _layer_with_group(a, b)
    try:
        await layer.group_send("g", {"type": "x.token", "n": 1})
        await _until(lambda: bool(a.events and b.events), "both sockets got the token")
        assert a.events == [{"type": "x.token", "n": 1}]
        assert a.events[0] is b.events[0]  # one deserialisation for the group, not one per socket
        assert all(layer._get_layer().channels[c].empty() for c in channels)  # nothing went through a queue
    finally:
        await layer.flush()


async def test_a_busy_socket_gets_its_messages_through_its_queue_and_in_order() -> None:
    idle, busy = Receiver(), Receiver()
    busy.ready = False
    layer, (_, channel) = await _layer_with_group(idle, busy)
    try:
        await layer.group_send("g", {"type": "x.token", "n": 1})
        await _until(lambda: len(idle.events) == 1, "the idle socket got token 1")
        first = await asyncio.wait_for(layer.receive(channel), 10)  # off the queue, as Channels takes it...
        busy.ready = True  # ...and not yet handled: its queue is empty, but token 1 is still in flight
        await layer.group_send("g", {"type": "x.token", "n": 2})
        await _until(lambda: len(idle.events) == 2, "the idle socket got token 2")
        assert busy.events == []  # token 2 must not overtake token 1
        layer.direct_dispatched(channel)  # token 1 handled; token 2 waits in the queue, so still queued
        second = await asyncio.wait_for(layer.receive(channel), 10)
        assert [first["n"], second["n"]] == [1, 2]
        layer.direct_dispatched(channel)  # the queue is empty and nothing is in flight: direct again
        await layer.group_send("g", {"type": "x.token", "n": 3})
        await _until(lambda: len(busy.events) == 1, "the drained socket got token 3 directly")
        assert busy.events[0]["n"] == 3
    finally:
        await layer.flush()


async def test_other_event_types_go_through_the_queue_and_hold_later_tokens_behind_them() -> None:
    receiver = Receiver()
    layer, (channel,) = await _layer_with_group(receiver)
    try:
        await layer.group_send("g", {"type": "x.end", "n": 1})
        await layer.group_send("g", {"type": "x.token", "n": 2})
        first = await asyncio.wait_for(layer.receive(channel), 10)
        second = await asyncio.wait_for(layer.receive(channel), 10)
        assert [first["type"], second["type"]] == ["x.end", "x.token"]
        assert receiver.events == []
    finally:
        await layer.flush()


async def test_one_failing_socket_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    broken, fine = Receiver(fail=True), Receiver()
    layer, _ = await _layer_with_group(broken, fine)
    try:
        await layer.group_send("g", {"type": "x.token", "n": 1})
        await layer.group_send("g", {"type": "x.token", "n": 2})
        await _until(lambda: len(fine.events) == 2, "the working socket got both tokens")
        assert "Delivering x.token" in caplog.text
    finally:
        await layer.flush()


async def test_the_reader_waits_for_messages_instead_of_polling_and_a_new_group_is_heard_at_once() -> None:
    receiver = Receiver()
    layer, _ = await _layer_with_group(receiver)
    shard = layer._get_layer()._shards[0]  # channels_redis internals: the one connection and its subscription
    reads = 0
    get_message = shard._pubsub.get_message

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await get_message(*args, **kwargs)

    shard._pubsub.get_message = counted
    try:
        await asyncio.sleep(1.0)
        assert reads <= 1, f"{reads} reads in 1 s with nothing published: the reader polls"  # channels_redis: 10
        late = await layer.new_channel()
        await layer.group_add("late", late)  # while the reader waits in a read
        started = time.monotonic()
        await layer.group_send("late", {"type": "x.end"})
        assert (await asyncio.wait_for(layer.receive(late), 10))["type"] == "x.end"
        assert time.monotonic() - started < 1.0  # not after the read's wait ran out
    finally:
        await layer.flush()


@pytest.mark.django_db(transaction=True)
async def test_a_chat_socket_takes_tokens_directly_once_connected(owner: Any, chat_session: Any) -> None:
    from channels.layers import get_channel_layer

    from tests.conftest import session_cookie_for
    from tests.wsclient import ChatSocket

    layer = get_channel_layer()
    assert isinstance(layer, FanoutPubSubChannelLayer)  # the product's setting
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    connected, _ = await sock.connect()
    assert connected
    try:
        snapshot = await sock.recv()
        assert snapshot["type"] == "session.snapshot"  # connect's own frame first, whatever was published
        assert len(layer._get_layer().direct) == 1
        for seq in range(1, 4):
            batch = events.token_batch_message(turn_id=9, seq_from=seq, seq_to=seq, text=str(seq), stats={})
            await events.group_send(events.session_group(chat_session.pk), batch)
        frames = [await sock.recv(timeout=10) for _ in range(3)]
        assert [(f["type"], f["seq_to"], f["text"]) for f in frames] == [("token", s, str(s)) for s in (1, 2, 3)]
    finally:
        await sock.close()
    await _until(lambda: not layer._get_layer().direct, "the closed socket left the layer")


@pytest.mark.django_db(transaction=True)
async def test_board_sockets_share_one_frame_of_an_event_without_a_thread_hop(
    admin_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board's events are direct (rigdash/ws.py, ``direct_events``): no close_old_connections hop through
    the sync thread per socket per event, and the frame is serialised once for every board socket."""
    import channels.consumer
    from channels.layers import get_channel_layer

    from rigdash import fastjson
    from tests.conftest import session_cookie_for
    from tests.wsclient import BoardSocket

    hops, dumps = [], []
    real_hop, real_dumps = channels.consumer.aclose_old_connections, fastjson.dumps

    async def counted_hop() -> None:
        hops.append(1)
        await real_hop()

    def counted_dumps(value: Any) -> bytes:
        dumps.append(value.get("type") if isinstance(value, dict) else None)
        return real_dumps(value)

    layer = get_channel_layer()
    cookie = await sync_to_async(session_cookie_for)(admin_user)
    socks = [BoardSocket(cookie) for _ in range(3)]
    for sock in socks:
        assert (await sock.connect())[0]
        assert (await sock.recv())["type"] == "board.snapshot"
    try:
        await _until(lambda: len(layer._get_layer().direct) == 3, "every board socket takes events directly")
        monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted_hop)
        monkeypatch.setattr(fastjson, "dumps", counted_dumps)
        for n in range(1, 4):
            await events.board_progress(progress={"turn": 7, "tokens": n, "decode_tps": 10.5})
        got = [[await sock.recv_until(lambda f: f["type"] == "progress") for _ in range(3)] for sock in socks]
        assert all([f["tokens"] for f in frames] == [1, 2, 3] for frames in got)
        assert got[0] == got[1] == got[2]
        assert hops == []
        assert dumps.count("progress") == 3  # once per event, not once per socket
    finally:
        for sock in socks:
            await sock.close()


async def test_a_subscribe_wakes_an_idle_reader_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing subscribed the reader waits for the next subscribe; channels_redis' own loop sleeps 0.1 s and looks
    again, so a /v1/ request's first token on a web process with no socket open could wait up to that long. (A
    sleeping reader may wake during a subscribe by chance: five rounds in a row leave that little chance.)"""
    layer = FanoutPubSubChannelLayer(hosts=[settings.REDIS_URL], prefix=f"wake{os.getpid()}x{next(_prefixes)}")
    try:
        channel = await layer.new_channel()
        shard = layer._get_layer()._shards[0]  # channels_redis internals: the one shard's connection
        reads: list[float] = []
        get_message = shard._pubsub.get_message

        async def counted(*args: Any, **kwargs: Any) -> Any:
            reads.append(time.monotonic())
            return await get_message(*args, **kwargs)

        monkeypatch.setattr(shard._pubsub, "get_message", counted)
        for _ in range(5):
            await shard.unsubscribe(channel)
            await _until(lambda: not shard._pubsub.subscribed, "the reader read the unsubscribe's reply")
            await asyncio.sleep(0.05)  # the reader found nothing subscribed: it waits
            reads.clear()
            await shard.subscribe(channel)
            for _ in range(20):  # a few turns of the event loop, no time: a sleeping reader would not read yet
                await asyncio.sleep(0)
            assert reads, "the reader did not start reading when a channel was subscribed"
    finally:
        await layer.flush()
