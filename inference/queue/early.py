"""The early lane: an API request's backend request goes out while its turn is still being stored.

A start ticket (inference/queue/tickets.py) takes the worker's reads and claim off a turn's time to first token, but
not the submit's own work: the session and turn INSERTs, the quota checks, the fair queue's dispatch under the rig's
lock, the commit, the Celery message. On an API request those are most of what RigDash adds before the backend hears
of it (docs/benchmarks.md). So once the request's key, body and model are checked, and the rig has a slot that no one
waits for, the web process pushes an *early ticket* straight to the worker serving the rig's queue, one Redis call,
and stores the turn as before. The worker sends the backend request at once and holds what it streams
(inference/worker/early.py).

The database still decides. Once the submit's dispatch has handed the turn out and committed, the web process
confirms the early ticket on the holder's own control list (``confirm``), then sends the turn's Celery task: the
process that holds the request claims the turn at once, without waiting for the task's sending or delivery,
wherever the task goes. Both name the early ticket (``StartTicket.early``); the worker uses the early request only
when the turn's ticket is the one it was sent for (same rig, model, conversation, parameters and token cap) and its
claim succeeds. Anything else closes it before any of it is published: a refusal (a quota, a rate limit: the submit
withdraws it at once, on the same control list), a dispatch that makes the turn wait, a ticket that differs (an
owner's per-reply limit the web process did not know), or no word within ``HOLD_S``.

Slots: the rig's free slot count, with nobody waiting, is kept in Redis by every dispatch of the rig
(``open_slots_set``), and an early ticket takes one atomically (``_OFFER``), so concurrent requests never send more
early requests than the rig has free slots; the dispatch's count replaces the hint at its commit. A rig served through
an agent (its worker runs on another host, with its own Redis permissions) gets no early lane.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis import Redis
from redis.commands.core import AsyncScript, Script
from redis.exceptions import RedisError

from inference.live.state import sync_client
from inference.queue.tickets import StartTicket

log = logging.getLogger(__name__)

HOLD_S = 2.0  # an early request no task names within this long is closed (a worker's clock, from its arrival)
STALE_S = 1.0  # an early ticket older than this when a worker takes it is dropped (it waited for a busy worker)
LIST_TTL_S = 30  # a rig queue's early list expires when no worker takes from it
CONTROL_TTL_S = 10  # an early request's control list, which its holder reads within HOLD_S of taking it
PAUSE_S = 10.0  # a key whose request did not use its early ticket gets none for this long (refused, or did not fit)

# KEYS: the rig's open-slot count, the rig queue's early list. ARGV: the message, the list's TTL.
# One free slot taken and the message pushed, or nothing (0).
_OFFER = """
local open = tonumber(redis.call('GET', KEYS[1]) or '0')
if open < 1 then return 0 end
redis.call('DECR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
return 1
"""


@functools.cache
def _offer_script(client: Redis) -> AsyncScript | Script:
    """``_OFFER`` as a script Redis keeps: sent by its digest (EVALSHA), its text only the first time."""
    return client.register_script(_OFFER)


_paused_until: dict[int, float] = {}  # key id -> monotonic time its early lane opens again (this process)


def open_slots_key(rig_id: int) -> str:
    return f"rigdash:rig:{rig_id}:open-slots"


def lane_key(queue: str) -> str:
    return f"rigdash:early:{queue}"


def control_key(early_id: str) -> str:
    """The list the process holding early request ``early_id`` reads its confirmation or withdrawal from."""
    return f"rigdash:early:control:{early_id}"


@dataclass
class EarlyStart:
    """An early ticket the web process sent for a turn it is storing. ``taken``: set by the submit when its dispatch
    handed the turn out with a start ticket naming this one (the worker may use the early request)."""

    id: str
    queue: str
    ticket: StartTicket
    taken: bool = False


def open_slots_set(rig_id: int, slots: int) -> None:
    """The rig's free slots that no waiting turn is owed, as its dispatch counted them (after its commit)."""
    try:
        sync_client().set(open_slots_key(rig_id), max(0, slots))
    except RedisError as exc:  # the lane only saves time: a stale count costs an early request or a missed one
        log.warning("rig %s: its open-slot count could not be written: %r", rig_id, exc)


def offer(*, key_id: int, queue: str, ticket: StartTicket) -> EarlyStart | None:
    """Send ``ticket`` (turn id 0: the turn is not stored yet) down the early lane of the rig's queue if the rig has
    an open slot; the EarlyStart to name in the turn's start ticket, or None (the turn starts as any other)."""
    if _paused_until.get(key_id, 0.0) > time.monotonic():
        return None
    early = EarlyStart(id=uuid.uuid4().hex, queue=queue, ticket=ticket)
    message = json.dumps({"id": early.id, "at": time.time(), "ticket": ticket.as_message()}, separators=(",", ":"))
    try:
        keys = (open_slots_key(ticket.rig_id), lane_key(queue))
        sent = _offer_script(sync_client())(keys=keys, args=(message, LIST_TTL_S))
    except RedisError as exc:
        log.warning("rig %s: the early lane could not be used: %r", ticket.rig_id, exc)
        return None
    return early if int(sent) == 1 else None  # type: ignore[arg-type]


def withdraw(early: EarlyStart, *, key_id: int) -> None:
    """The turn does not use its early request (refused, waiting, or its ticket differs): the worker closes it now
    rather than after ``HOLD_S``, and the key's next requests wait for the database's word before any backend work
    for ``PAUSE_S`` (a key whose requests are refused, or never fit, costs the backend nothing)."""
    _paused_until[key_id] = time.monotonic() + PAUSE_S
    try:
        _control_push({early.id: {"withdraw": True}})
    except RedisError as exc:
        log.warning("early request %s could not be withdrawn (its worker closes it after %g s): %r", early.id, HOLD_S,
                    exc)  # fmt: skip


def confirm(tickets: Sequence[StartTicket]) -> set[int]:
    """After the commit that handed these turns out: each early request a ticket names may be claimed by the process
    holding it now. The ids of the turns whose word went out; without it (Redis refused it), the turn's task still
    claims it where it is delivered."""
    words = {ticket.early: {"confirm": ticket.as_message()} for ticket in tickets if ticket.early}
    if not words:
        return set()
    try:
        _control_push(words)
    except RedisError as exc:
        log.warning("early requests %s could not be confirmed (their tasks claim them): %r", sorted(words), exc)
        return set()
    return {ticket.turn_id for ticket in tickets if ticket.early}


def _control_push(words: dict[str, dict[str, Any]]) -> None:
    with sync_client().pipeline(transaction=False) as pipe:
        for early_id, word in words.items():
            pipe.rpush(control_key(early_id), json.dumps(word, separators=(",", ":")))
            pipe.expire(control_key(early_id), CONTROL_TTL_S)
        pipe.execute()


def fits(sent: StartTicket, ticket: StartTicket) -> bool:
    """The early ticket ``sent`` asks the backend for exactly what the turn's ``ticket`` does: same rig, model,
    conversation, parameters and token cap (the turn's id, the owner's context limit, checked on the backend's
    prompt count, and the early id are the turn's alone)."""
    return replace(sent, turn_id=ticket.turn_id, context_limit=ticket.context_limit, early=ticket.early) == ticket


def message_parse(raw: bytes | str) -> tuple[str, float, dict[str, Any]] | None:
    """A lane message (an offer) as the worker reads it: (id, sent at, ticket); None for one that is not."""
    message = _json_object(raw)
    at, ticket = message.get("at"), message.get("ticket")
    if isinstance(message.get("id"), str) and isinstance(at, int | float) and isinstance(ticket, dict):
        return message["id"], float(at), ticket
    return None


def control_parse(raw: bytes | str) -> dict[str, Any] | None:
    """A control list's word: the turn's start ticket (confirmed), or None (withdrawn, or not a word)."""
    ticket = _json_object(raw).get("confirm")
    return ticket if isinstance(ticket, dict) else None


def _json_object(raw: bytes | str) -> dict[str, Any]:
    try:
        message = json.loads(raw)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}
