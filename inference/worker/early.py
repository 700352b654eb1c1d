"""The worker's end of the early lane (inference/queue/early.py): early tickets are taken from the lanes of the rig
queues this worker consumes, their backend requests sent at once and held, unpublished, until the web process
confirms the turn on the request's control list (this process then claims it: ``_confirmed``), the turn's task names
it here first (``take``), a withdrawal comes, or ``HOLD_S`` passes. A held request is the ticketed start's
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
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from inference.queue.early import HOLD_S, STALE_S, control_key, control_parse, fits, lane_key, message_parse
from inference.queue.tickets import StartTicket, ticket_from_message

log = logging.getLogger(__name__)

Claim = concurrent.futures.Future[Any]  # a held request's claim: the ClaimedTurn, or None (close it)
# Sends a ticket's backend request before its claim (start.early_send): its claim, run and write, or None (the rig is
# not one this process has seen: it never connects where a ticket alone says).
Started = tuple[Claim, concurrent.futures.Future[None], concurrent.futures.Future[None]]  # claim, run, written
Sender = Callable[[StartTicket], Started | None]
Claimer = Callable[[StartTicket], Claim]  # claims a confirmed turn (start.early_claim): what it got, or None
POLL_S = 1  # the longest a lane read blocks: the queues consumed are read again after it
READ_GRACE_S = 5.0


@dataclass
class Held:
    ticket: StartTicket  # as the web process sent it (turn id 0)
    claim: Claim
    run: concurrent.futures.Future[None]


_held: dict[str, Held] = {}
_lock = threading.Lock()
_watching: set[asyncio.Task[None]] = set()  # each held request's control read (a task only the loop refers to may
# be collected)
_control_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()


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


def _confirmed(early_id: str, ticket: StartTicket, claim: Claimer) -> None:
    """The web process stored and handed out the turn whose ticket is ``ticket``: claim it here, now, if the held
    request is still here (the turn's task did not take it first) and was sent for exactly that ticket."""
    if (held := take(ticket)) is None:
        return
    log.debug("turn %s: confirmed on its early request's control list (%s)", ticket.turn_id, early_id)

    def settle(claimed: Claim) -> None:
        if held.claim.done():
            return
        if (exc := claimed.exception()) is not None:
            held.claim.set_exception(exc)
        else:
            held.claim.set_result(claimed.result())

    claim(ticket).add_done_callback(settle)


def accept(raw: bytes | str, send: Sender, claim: Claimer) -> None:
    """One lane message: an early ticket to send, then hold while its control list is read."""
    parsed = message_parse(raw)
    if parsed is None:
        log.warning("an early-lane message that is not one was ignored")
        return
    early_id, sent_at, body = parsed
    ticket = ticket_from_message(body)
    if ticket is None or time.time() - sent_at > STALE_S:
        return  # its turn starts from its task, as any other
    started = send(ticket)
    if started is None:
        return
    request_claim, run, written = started
    with _lock:
        _held[early_id] = Held(ticket=ticket, claim=request_claim, run=run)
    watch = asyncio.get_running_loop().create_task(_control(early_id, claim, written))
    _watching.add(watch)
    watch.add_done_callback(_watching.discard)


async def _control(early_id: str, claim: Claimer, written: concurrent.futures.Future[None]) -> None:
    """Wait up to ``HOLD_S`` for the held request's word: a confirmation claims its turn here; a withdrawal, no
    word in time, or a list that cannot be read closes it. The read starts once the backend request is written, so
    that its Redis call is not sent before the request (a word waits in its list meanwhile)."""
    try:
        await asyncio.wrap_future(written)
        read = _control_client().blpop([control_key(early_id)], timeout=HOLD_S)
        got = await cast("Awaitable[list[Any] | None]", read)  # the asyncio client's commands are awaitable
        word = None if got is None else control_parse(got[1])
        ticket = None if word is None else ticket_from_message(word)
        if ticket is not None:
            _confirmed(early_id, ticket, claim)
    except (RedisError, OSError) as exc:
        log.warning("early request %s: its control list could not be read: %r", early_id, exc)
    finally:
        _release(early_id)  # nothing, once confirmed or taken


def _control_client() -> aioredis.Redis:
    """This loop's client for the control lists: one connection per held request while it waits (a pool)."""
    running = asyncio.get_running_loop()
    if (client := _control_clients.get(running)) is None:
        client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=HOLD_S + READ_GRACE_S)
        _control_clients[running] = client
    return client


async def listen(queues: Callable[[], list[str]], send: Sender, claim: Claimer) -> None:
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
                accept(got[1], send, claim)
            except Exception:  # one bad message never stops the lane
                log.exception("an early-lane message failed")
