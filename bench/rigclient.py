"""A RigDash client as a tab is one: a websocket on /ws/chat/<session>/ that sends turn.send and reads tokens.

Frames (docs/streaming.md): the server opens with ``session.snapshot``; a sent turn comes back as
``turn.queued`` (its id), then ``turn.state``, ``token`` batches (``seq_from``..``seq_to``, ``text``)
and ``turn.end`` (the stored turn). Arrival times are ``time.time()`` when the frame was read.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from bench import stats
from bench.wsproto import WSClient, WSClosed


@dataclass
class TurnWatch:
    """What one tab saw of one turn."""

    t_send: float | None = None  # set on the tab that sent it
    turn_id: int | None = None
    t_queued: float | None = None  # turn.queued arrived: the web server stored the turn
    batches: list[tuple[float, int, int, str]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    t_end: float | None = None
    error: str | None = None

    def delivery(self) -> stats.Delivery:
        return stats.seq_delivery(self.batches)


class Tab:
    def __init__(self, client: WSClient, session_id: int) -> None:
        self.client = client
        self.session_id = session_id

    @classmethod
    async def open(cls, port: int, session_id: int, cookie: str) -> Tab:
        client = await WSClient.connect(port, f"/ws/chat/{session_id}/", cookie=cookie)
        _, first = await client.recv_json(timeout_s=30)
        if first.get("type") != "session.snapshot":
            raise RuntimeError(f"expected session.snapshot, got {first}")
        return cls(client, session_id)

    async def send_turn(self, text: str, params: dict[str, Any]) -> float:
        t_send = time.time()
        await self.client.send_json({"type": "turn.send", "text": text, "params": params})
        return t_send

    async def watch(self, *, timeout_s: float, t_send: float | None = None) -> TurnWatch:
        """Read frames until the first turn seen on this session ends (bounded by timeout_s)."""
        watch = TurnWatch(t_send=t_send)
        deadline = time.monotonic() + timeout_s
        try:
            while watch.end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    watch.error = f"no turn.end within {timeout_s:g} s"
                    break
                arrived, frame = await self.client.recv_json(timeout_s=left)
                kind = frame.get("type")
                if kind == "turn.queued" and watch.turn_id is None:
                    watch.turn_id, watch.t_queued = frame["turn"]["id"], arrived
                elif kind == "token" and frame["turn"] == watch.turn_id:
                    watch.batches.append((arrived, frame["seq_from"], frame["seq_to"], frame["text"]))
                elif kind == "turn.end" and frame["turn"]["id"] == watch.turn_id:
                    watch.end, watch.t_end = frame["turn"], arrived
                elif kind == "error":
                    watch.error = f"{frame.get('code')}: {frame.get('message')}"
                    break
        except (TimeoutError, WSClosed, OSError) as exc:
            watch.error = watch.error or repr(exc)
        return watch

    async def close(self) -> None:
        await self.client.close()


async def run_turn(
    sender: Tab, watchers: list[Tab], text: str, params: dict[str, Any], *, timeout_s: float
) -> tuple[TurnWatch, list[TurnWatch]]:
    """Send a turn from ``sender`` and follow it on the sender and every watcher until it ends."""
    others = [asyncio.create_task(tab.watch(timeout_s=timeout_s)) for tab in watchers]
    await asyncio.sleep(0)
    t_send = await sender.send_turn(text, params)
    mine = await sender.watch(timeout_s=timeout_s, t_send=t_send)
    return mine, list(await asyncio.gather(*others))
