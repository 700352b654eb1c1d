"""A socket that cannot keep up never holds up the others nor fills memory (a bounded outbox, closed on overflow so
the page reconnects and resyncs), and a per-user frame rate limit answers a flood with one clear error frame."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from inference.models import ChatSession, Rig
from rigdash.ws import CLOSE_TOO_SLOW, FrameRate, GroupJsonConsumer
from tests.conftest import session_cookie_for
from tests.test_channel_layer import Receiver, _layer_with_group, _until
from tests.wsclient import ChatSocket


class SlowReceiver(Receiver):
    """A socket whose consumer is stuck sending (its client does not read): every event goes to its queue."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = False
        self.overflowed = 0

    def outbox_overflow(self) -> None:
        self.overflowed += 1


async def test_a_socket_over_its_outbox_is_closed_and_the_others_get_every_event(settings) -> None:
    settings.WS_OUTBOX_MAX = 10
    fast, slow = Receiver(), SlowReceiver()
    layer, (_, slow_channel) = await _layer_with_group(fast, slow)
    try:
        for n in range(25):
            await layer.group_send("g", {"type": "x.token", "n": n})
        await _until(lambda: len(fast.events) == 25, "the reading socket got every token")
        assert [e["n"] for e in fast.events] == list(range(25))
        assert slow.overflowed >= 1
        assert layer._get_layer().channels[slow_channel].qsize() <= 10  # bounded: never more than the outbox
    finally:
        await layer.flush()


class Stuck(GroupJsonConsumer):
    direct_events = frozenset({"x.token"})

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sent: list[int] = []

    async def x_token(self, event: dict[str, Any]) -> None:
        await self.gate.wait()  # the web server's send, waiting for a client that does not read
        self.sent.append(event["n"])


async def test_a_send_that_waits_does_not_hold_up_the_layers_reader() -> None:
    consumer = Stuck()
    await asyncio.wait_for(consumer.direct_deliver({"type": "x.token", "n": 1}), timeout=1)  # returns at once
    assert consumer._busy == 1 and not consumer.direct_ready("x.token")  # later events take its queue
    consumer.gate.set()
    await _until(lambda: consumer._busy == 0, "the slow send finished on its own task")
    assert consumer.sent == [1] and consumer.direct_ready("x.token")


def test_the_frame_rate_is_a_token_bucket_per_user(settings) -> None:
    settings.WS_FRAMES_PER_S = 5
    rate = FrameRate()
    assert all(rate.allow(1, now=100.0) for _ in range(10))  # a burst of twice the rate
    assert not rate.allow(1, now=100.0)
    assert rate.allow(2, now=100.0)  # another user has their own
    assert rate.allow(1, now=100.3)  # refilled at 5 a second


@pytest.mark.django_db(transaction=True)
async def test_a_flood_of_frames_gets_one_rate_limited_error_and_the_socket_goes_on(owner, settings) -> None:
    settings.WS_FRAMES_PER_S = 5

    def setup() -> int:
        rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
        return ChatSession.objects.create(owner=owner, rig=rig, model_name="m").pk

    sock = ChatSocket(await sync_to_async(setup)(), await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()  # session.snapshot
    for _ in range(40):
        await sock.send({"type": "turn.resync", "turn": 123456})
    frames = []
    while not await sock.comm.receive_nothing(timeout=1):
        frames.append(json.loads(await sock.comm.receive_from(timeout=5)))
    codes = [f.get("code") for f in frames]
    assert codes.count("rate_limited") == 1, codes
    assert 10 <= codes.count("not_found") <= 13  # the burst allowance (twice the rate), and what refills meanwhile
    await asyncio.sleep(0.5)
    await sock.send({"type": "turn.resync", "turn": 123456})
    assert (await sock.recv(timeout=5))["code"] == "not_found"
    await sock.close()
    assert CLOSE_TOO_SLOW == 4408
