"""One turn's reply as a chat socket receives it, for a view: pushed through the channel layer, in seq order, each
piece once, with the same resync as the browser's (docs/streaming.md).

The listener joins the turn's session group (``events.session_group``) on a channel of its own. With RigDash's layer
(rigdash/channel_layer.py) the layer's reader hands it each event directly, as it does an idle chat socket
(``direct_ready`` / ``direct_deliver``); with any other layer the events come through the channel's queue. Pub/sub
may drop a message (a reconnect, a full outbox), so nothing is trusted to arrive:

- what the worker published before the listener joined (its claim can beat the view to the group) is read from the
  turn's live list once the listener has joined (``TurnListener.published``), and the turn's row is asked soon
  after, since its end may have gone by too;
- a ``chat.token`` batch whose ``seq_from`` is not the next seq (one was missed) is answered by one read of the
  turn's live list (``state.snapshot``), which holds seq 1..n; a batch already held is dropped;
- the end is ``chat.turn_end``, or, when no event came for ``CHECK_S``, the turn's row says it ended (its end
  message was lost, or the turn ended before the listener joined); the row's ``reply_text`` then gives any text
  not yet sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from channels.db import DatabaseSyncToAsync
from channels.layers import get_channel_layer
from django.conf import settings
from redis.exceptions import RedisError

from inference import events
from inference.live import state
from inference.models import Turn

log = logging.getLogger(__name__)

CHECK_S = 1.0  # with no event for this long, the turn's row is read: has it ended?
CAUGHT_UP_CHECK_S = 0.05  # the same, first, for a turn that published before the listener joined
EVENT_TYPES = frozenset({"chat.token", "chat.turn_end"})

# The API views' database work runs on these threads. Django's ASGI handler gives each request a new thread, and a
# database connection opened there would be opened per request and never reused; these threads keep theirs for
# CONN_MAX_AGE, as Channels' database thread does for the chat sockets, and close a connection past its age or
# broken before and after each call (``channels.db.DatabaseSyncToAsync``).
_DB_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rigdash-api-db")
P = ParamSpec("P")
R = TypeVar("R")


def on_db_thread(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``func`` as a coroutine run on one of the API's database threads."""
    wrapped: Callable[P, Coroutine[Any, Any, R]] = DatabaseSyncToAsync(func, thread_sensitive=False,
                                                                       executor=_DB_THREADS)  # fmt: skip
    return wrapped


class TurnListener:
    """The events of one turn, from the moment ``join`` returns until ``leave``."""

    def __init__(self, *, session_id: int, turn_id: int, forget: bool = False) -> None:
        self.group = events.session_group(session_id)
        self.turn_id = turn_id
        self.forget = forget  # a key that stores nothing: the view wipes the turn's texts once it has them
        self.layer: Any = get_channel_layer()
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.channel = ""
        self._holder: asyncio.Task[None] | None = None
        self._direct = False
        self.published: state.LiveSnapshot | None = None  # the live list as it was once the listener joined

    async def join(self) -> None:
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        if (direct_add := getattr(self.layer, "direct_add", None)) is not None:
            direct_add(self.channel, self)
            self._direct = True
        # Receives what the layer queues (any layer but RigDash's, or a message to this channel alone); cancelling it
        # is how channels_redis drops the channel and its subscription (as when a consumer ends).
        self._holder = asyncio.get_running_loop().create_task(self._receive())
        # Then the batches published before the subscription. The SUBSCRIBE was written before this read is sent (on
        # another connection, after a thread hop), so Redis runs it first: every batch is in the list or in an event,
        # or both (``reply_pieces`` keeps each once); one that fell between would come back by the seq gap's resync.
        try:
            self.published = await _snapshot(self.turn_id)
        except (RedisError, OSError, ValueError) as exc:  # the events and the end's row check still give the reply
            log.warning("turn %s: its live list could not be read as the listener joined: %r", self.turn_id, exc)

    async def leave(self) -> None:
        if self._direct:
            self.layer.direct_discard(self.channel)
            self._direct = False
        if self.channel:
            await self.layer.group_discard(self.group, self.channel)
        if self._holder is not None:
            self._holder.cancel()
            await asyncio.gather(self._holder, return_exceptions=True)
            self._holder = None

    async def _receive(self) -> None:
        while True:
            self._take(await self.layer.receive(self.channel))

    # rigdash.channel_layer.DirectReceiver: the layer's reader calls these for this channel's group messages.
    def direct_ready(self, event_type: str) -> bool:
        return True

    async def direct_deliver(self, event: dict[str, Any]) -> None:
        self._take(event)

    def outbox_overflow(self) -> None:
        """The layer dropped what waited for this channel: the seq gap or the end check makes up for it."""

    def _take(self, event: dict[str, Any]) -> None:
        if event.get("type") not in EVENT_TYPES:
            return
        turn = event["turn"]["id"] if event["type"] == "chat.turn_end" else event.get("turn")
        # Bounded: a client reading slower than the reply comes loses events here, and the seq gap resyncs it.
        if turn == self.turn_id and self.inbox.qsize() < settings.WS_OUTBOX_MAX:
            self.inbox.put_nowait(event)

    async def next_event(self, timeout_s: float) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(self.inbox.get(), timeout_s)
        except TimeoutError:
            return None


def _ended_turn(turn_id: int) -> Turn | None:
    turn = Turn.objects.filter(pk=turn_id).first()
    return turn if turn is None or turn.status not in Turn.ACTIVE else None


ended_turn = on_db_thread(_ended_turn)  # the turn's row once it has ended; None while it is waiting or running


_snapshot = sync_to_async(state.snapshot, thread_sensitive=False)


# Beside a batch's text, as a dict: a reasoning model's thoughts, {"thinking"}, before it; an API client's tool-call
# deltas and logprobs, {"tool_calls", "logprobs"}, after it.
Extras = dict[str, Any]


async def reply_pieces(listener: TurnListener) -> AsyncIterator[str | Extras | Turn]:
    """The turn's reply text as it comes, each piece once and in order, then its ended row (the last item). A batch's
    thoughts come before its text and its tool-call deltas or logprobs after it, as dicts (``Extras``); a batch
    missed is resynced from the live list, which holds the text and the thoughts: the view makes up missed tool calls
    from the ended row."""
    seq, sent, thought = 0, "", ""
    wait = CHECK_S
    if (caught := listener.published) is not None and caught.seq:
        seq, sent, thought = caught.seq, caught.text, caught.thinking
        if caught.thinking:
            yield {"thinking": caught.thinking}
        if caught.text:
            yield caught.text
        wait = CAUGHT_UP_CHECK_S
    while True:
        event = await listener.next_event(wait)
        wait = CHECK_S
        if event is None or event["type"] == "chat.turn_end":
            ended = await ended_turn(listener.turn_id)
            if ended is None:
                continue  # still waiting or running (or its end is not committed yet: asked again later)
            if ended.reply_text.startswith(sent) and len(ended.reply_text) > len(sent):
                yield ended.reply_text[len(sent) :]  # what was missed at the end
            yield ended
            return
        if event["seq_to"] <= seq:
            continue  # held already (it came after a resync that included it)
        extras: Extras | None = None
        if event["seq_from"] == seq + 1:
            frame = json.loads(event["frame"])
            text, thinking = frame["text"], frame.get("thinking") or ""
            seq = event["seq_to"]
            if "tool_calls" in frame or "logprobs" in frame:
                extras = {"tool_calls": frame.get("tool_calls"), "logprobs": frame.get("logprobs")}
        else:  # a batch was missed: the live list holds every batch so far
            current = await _snapshot(listener.turn_id)
            if not current.text.startswith(sent) or not current.thinking.startswith(thought):
                log.warning(
                    "turn %s: the live list does not continue the text sent; waiting for the end", listener.turn_id
                )
                continue
            text, thinking, seq = current.text[len(sent) :], current.thinking[len(thought) :], current.seq
        sent, thought = sent + text, thought + thinking
        if thinking:
            yield {"thinking": thinking}
        if text:
            yield text
        if extras is not None:
            yield extras
