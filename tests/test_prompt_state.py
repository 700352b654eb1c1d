"""The page's 'prompt' state goes out only when a turn's prompt outlasts its delay (worker/prompt.py, start.py),
through the real channel layer and Redis."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from channels.layers import get_channel_layer

from inference import events
from inference.worker.prompt import PromptState


async def _subscribed(layer: object, group: str) -> str:
    """A channel in ``group``, subscribed for certain: probes are published until one arrives."""
    channel = await layer.new_channel()  # type: ignore[attr-defined]
    await layer.group_add(group, channel)  # type: ignore[attr-defined]
    for _ in range(200):
        await layer.group_send(group, {"type": "probe"})  # type: ignore[attr-defined]
        try:
            await asyncio.wait_for(layer.receive(channel), 0.05)  # type: ignore[attr-defined]
            return channel
        except TimeoutError:
            continue
    raise AssertionError("the channel layer never delivered a probe")


async def _drain(layer: object, channel: str, quiet_s: float = 0.3) -> list[dict]:
    got = []
    while True:
        try:
            got.append(await asyncio.wait_for(layer.receive(channel), quiet_s))  # type: ignore[attr-defined]
        except TimeoutError:
            return [m for m in got if m["type"] != "probe"]


async def test_the_prompt_state_goes_out_only_when_the_prompt_outlasts_the_delay():
    layer = get_channel_layer()
    session_id = 900_000 + os.getpid() % 1000
    channel = await _subscribed(layer, events.session_group(session_id))
    # Stand-ins for Turn rows: PromptState reads only pk and session_id (no database needed).
    fast, slow, ended = (SimpleNamespace(pk=pk, session_id=session_id) for pk in (1, 2, 3))

    quick = PromptState(fast, delay_s=0.2)  # the first token comes after 10 ms
    await asyncio.sleep(0.01)
    await quick.settle()
    long = PromptState(slow, delay_s=0.01)  # the prompt takes 150 ms
    await asyncio.sleep(0.15)
    await long.settle()
    failed = PromptState(ended, delay_s=0.2)  # the turn fails before any token and before the delay
    await failed.settle()

    sent = await _drain(layer, channel)
    assert sent == [{"type": "chat.turn_state", "turn": 2, "status": "prompt"}]
    await layer.group_discard(events.session_group(session_id), channel)
