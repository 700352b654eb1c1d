"""The worker's end of the early lane (inference/queue/early.py): early tickets are taken from the lanes of the rig
queues this worker consumes, their backend requests sent at once and held, unpublished, until the turn's task names
them (``take``), a withdrawal comes, or ``HOLD_S`` passes. A held request is the ticketed start's
(``start.run_ticketed_turn``) before its claim: its claim resolves to None to close it.

Only a worker whose tasks run in its own process (the thread or solo pool) listens: under a prefork pool a
child runs the task, and the request held by the parent could never be taken.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from inference.queue.early import HOLD_S, STALE_S, fits, lane_key, message_parse
from inference.queue.tickets import StartTicket, ticket_from_message

log = logging.getLogger(__name__)

Claim = concurrent.futures.Future[Any]  # a held request's claim: the ClaimedTurn, or None (close it)
# Sends a ticket's backend request before its claim (start.early_send): its claim and run, or None (the rig is not
# one this process has seen: it never connects where a ticket alone says).
Sender = Callable[[StartTicket], tuple[Claim, concurrent.futures.Future[None]] | None]
POLL_S = 1  # the longest a lane read blocks: the queues consumed are read again after it
READ_GRACE_S = 5.0


@dataclass
class Held:
    ticket: StartTicket  # as the web process sent it (turn id 0)
    claim: Claim
    run: concurrent.futures.Future[None]


_held: dict[str, Held] = {}
_lock = threading.Lock()


def take(ticket: StartTicket) -> Held | None:
    """The held request the turn's ticket names, if it was sent for exactly this ticket (same rig, model,
    conversation, parameters and token cap); it leaves the hold. One sent for another is closed."""
    if not ticket.early:
        return None
    with _lock:
        held = _held.pop(ticket.early, None)
    if held is None:
        return None
    if not fits(held.ticket, ticket):
        log.info("turn %s: its early request was sent for another ticket; closed", ticket.turn_id)
        _close(held)
        return None
    return held


def _close(held: Held) -> None:
    if not held.claim.done():
        held.claim.set_result(None)


def _release(early_id: str) -> None:
    with _lock:
        held = _held.pop(early_id, None)
    if held is not None:
        _close(held)


def accept(raw: bytes | str, send: Sender) -> None:
    """One lane message: an early ticket to send and hold, or a withdrawal."""
    parsed = message_parse(raw)
    if parsed is None:
        log.warning("an early-lane message that is not one was ignored")
        return
    kind, early_id, sent_at, body = parsed
    if kind == "withdraw":
        _release(early_id)
        return
    ticket = ticket_from_message(body)
    if ticket is None or time.time() - sent_at > STALE_S:
        return  # its turn starts from its task, as any other
    started = send(ticket)
    if started is None:
        return
    claim, run = started
    with _lock:
        _held[early_id] = Held(ticket=ticket, claim=claim, run=run)
    asyncio.get_running_loop().call_later(HOLD_S, _release, early_id)


async def listen(queues: Callable[[], list[str]], send: Sender) -> None:
    """Take from the early lanes of the queues this worker consumes (read again after each wait), for as long as the
    process runs."""
    # A read that outlasts its block by READ_GRACE_S is given up (a connection that died without a word).
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=POLL_S + READ_GRACE_S)
    while True:
        names = queues()
        if not names:
            await asyncio.sleep(POLL_S)
            continue
        try:
            got = await client.blpop([lane_key(name) for name in names], timeout=POLL_S)
        except (RedisError, OSError) as exc:
            log.warning("the early lane could not be read: %r", exc)
            await asyncio.sleep(POLL_S)
            continue
        if got is not None:
            try:
                accept(got[1], send)
            except Exception:  # one bad message never stops the lane
                log.exception("an early-lane message failed")
