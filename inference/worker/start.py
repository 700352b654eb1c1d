"""How a worker starts the turns a Celery task hands it: claim them (a ticketed turn's backend request goes out
before its claim: inference/queue/tickets.py) and run each on the process's one asyncio loop (inference/worker/loop.py;
inference/worker/stream.py streams it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async as db_async
from django.db import DatabaseError, close_old_connections
from redis.exceptions import RedisError

from inference import events
from inference.backends.base import ChatRequest
from inference.db import gated
from inference.errors import InvalidInput
from inference.live import energy, state
from inference.models import Rig, Turn
from inference.queue.quotas import TurnBudget
from inference.queue.tickets import StartTicket, tickets_by_turn
from inference.turns import board_rows, lifecycle
from inference.turns import params as turn_params
from inference.turns.selectors import turn_snapshot
from inference.worker import claim as claims
from inference.worker import early as early_lane
from inference.worker import embed, loop, stream
from inference.worker.prompt import PromptState
from inference.worker.reader import OpenedStream, open_stream

log = logging.getLogger(__name__)
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
Claim = concurrent.futures.Future[claims.ClaimedTurn | None]  # a turn's claim: what it got, or None (not claimed)
SENT_WAIT_S = 1.0  # the longest a claim waits for its ticketed requests to be written (a rig that does not answer)
# The page's 'prompt' state goes out only for a prompt longer than this (inference/worker/prompt.py). Short of it, the
# state would reach the page a frame or two before the first token, and a burst of turns starting together would each
# send one more frame to every watcher, ahead of its first token.
PROMPT_STATE_DELAY_S = 0.05
FINISH_RETRY_S = (0.5, 2.0, 5.0)  # a turn's end the database refused is stored again after each of these, then left


def _chat_request(model: str, messages: list[dict[str, Any]], max_tokens: int, params: dict[str, Any]) -> ChatRequest:
    return turn_params.chat_request(model, messages, max_tokens, params)


async def run_claimed_turn(
    turn: Turn,
    messages: list[dict[str, Any]],
    budget: TurnBudget | InvalidInput,
    opened: OpenedStream | None = None,
) -> None:
    """Send the backend request first (unless it went out before the claim: ``opened``); everything else about
    the start happens while the prompt is read. ``budget``: the reply's token cap, or why the turn cannot run (a
    quota leaves it no tokens; its start ticket disagrees with it): it then ends as failed with that reason."""
    rig_id = turn.session.rig_id
    prompt_state = PromptState(turn, PROMPT_STATE_DELAY_S)
    started_row = asyncio.create_task(db_async(board_rows.publish_turn, thread_sensitive=False)(turn.pk))  # the board
    if isinstance(budget, InvalidInput):
        exc = budget
        if opened is not None:
            await opened.close()
        outcome = lifecycle.TurnOutcome(
            status=Turn.Status.FAILED,
            reply_text="",
            finish_reason=exc.code,
            stats={"output_events": 0},
            error=exc.message,
        )
    elif turn_params.one_answer(turn.params):  # embeddings, a rerank (never ticketed): one answer, nothing streamed
        outcome = await embed.embeddings_outcome(turn, turn.session.rig, loop.redis_for_loop())
    else:
        request = _chat_request(turn.session.model_name, messages, budget.max_tokens, turn.params or {})
        redis = loop.redis_for_loop()
        energy_start_read = asyncio.create_task(_energy_mark(redis, rig_id))  # beside the request, not before it
        outcome = await stream.stream_turn(
            turn,
            request,
            redis,
            context_quota=budget.context_limit,
            prompt_state=prompt_state,
            opened=opened,
        )
        energy_start, energy_end = await energy_start_read, await _energy_mark(redis, rig_id)
        if energy_start is not None and energy_end is not None and outcome.stats.get("output_tokens"):
            outcome.stats.update(energy.turn_energy(energy_start, energy_end))
    await prompt_state.settle()
    try:
        await started_row  # the board's "started" row goes out before the end
    except DatabaseError as exc:  # a view: the board reads the turn again at its end
        log.warning("turn %s: the board's row could not be read: %r", turn.pk, exc)
    stored = await _store_end(turn, outcome)
    if not stored:
        log.warning("turn %s had already ended when its worker finished", turn.pk)
        return
    await db_async(turn.refresh_from_db)()
    # The board hears of the end and the next waiting turn gets the slot before the page hears of it.
    await db_async(gated(lifecycle.turn_released))(turn_id=turn.pk, rig_id=rig_id)
    snapshot = await db_async(turn_snapshot)(turn)
    await events.turn_end(session_id=turn.session_id, turn=snapshot, seq=outcome.stats["output_events"])
    await db_async(state.forget)(turn.pk)


async def _energy_mark(redis: Any, rig_id: int) -> energy.EnergyMark | None:
    """The rig's energy account (inference/live/energy.py); None where Redis cannot say: the turn runs all the same."""
    try:
        return await energy.energy_mark(redis, rig_id)
    except (OSError, RedisError, ValueError) as exc:
        log.warning("rig %s: its energy account could not be read: %r", rig_id, exc)
        return None


async def _store_end(turn: Turn, outcome: lifecycle.TurnOutcome) -> bool:
    """Store the turn's end (``lifecycle.turn_finish``). A database that refuses it (restarting, a dropped connection)
    gets a few more tries: without its end the turn would wait for the reaper, and end as interrupted, with its text
    but without its finish reason and stats. The last try's error reaches the task, and the reaper ends the turn."""
    finish: Callable[..., Awaitable[bool]] = db_async(gated(lifecycle.turn_finish))
    for retry_in in FINISH_RETRY_S:
        try:
            return await finish(turn=turn, outcome=outcome)
        except DatabaseError as exc:
            log.warning("turn %s: storing its end failed (%r); trying again in %g s", turn.pk, exc, retry_in)
            await asyncio.sleep(retry_in)
    return await finish(turn=turn, outcome=outcome)


# Where each rig's requests go, as this process last read it from the database: a ticketed turn's request goes
# there before its claim reads the rig again (a ticket never says where to connect). Kind, base URL and the
# backend's key by rig id.
_rigs_seen: dict[int, tuple[str, str, str]] = {}


async def run_ticketed_turn(
    ticket: StartTicket,
    seen: tuple[str, str, str],
    claim: Claim,
    sent: concurrent.futures.Future[None],
    sent_by: str = "ticket",
) -> None:
    """Send a ticketed turn's backend request, then wait for its claim (on the claim thread). ``sent`` is set once
    the request is written, or could not be. Not claimed (cancelled, or another delivery's): the request is closed
    and nothing of it was published. The rig moved since this process last saw it: the request is closed and sent
    again where the rig is now."""

    def mark_sent(*_: Any) -> None:
        if not sent.done():
            sent.set_result(None)

    kind, base_url, api_key = seen
    request = _chat_request(ticket.model, ticket.messages, ticket.max_tokens, ticket.params)
    try:
        rig = Rig(pk=ticket.rig_id, kind=kind, base_url=base_url, api_key=api_key)
        opened = open_stream(rig, request, on_sent=mark_sent)
        opened.sent_by = sent_by
    except BaseException:
        mark_sent()
        raise
    opened.reader.add_done_callback(mark_sent)  # the request failed before it was written
    try:
        claimed = await asyncio.wrap_future(claim)
    except BaseException:
        await opened.close()
        raise
    keep = claimed is not None and _where(claimed.turn.session.rig) == seen
    if not keep:
        await opened.close()
    if claimed is not None:
        await run_claimed_turn(claimed.turn, claimed.messages, claimed.budget, opened=opened if keep else None)


def early_send(ticket: StartTicket) -> early_lane.Started | None:
    """An early ticket's backend request (inference/worker/early.py), sent as a ticketed turn's is, to where this
    process last saw its rig: its claim, its run, and its write (set once the request is written, or could not be);
    None for a rig it has not seen."""
    if (seen := _rigs_seen.get(ticket.rig_id)) is None:
        return None
    claim: Claim = concurrent.futures.Future()
    sent: concurrent.futures.Future[None] = concurrent.futures.Future()
    return claim, loop.start(run_ticketed_turn(ticket, seen, claim, sent, "early lane")), sent


def early_claim(ticket: StartTicket) -> Claim:
    """Claim a turn whose early request this process holds, once the web process has confirmed it (on the claim
    thread, as a task's claim): the turn's task, wherever it lands, then finds it claimed."""

    def claim_one() -> claims.ClaimedTurn | None:
        claimed = _claim([ticket.turn_id], {ticket.turn_id: ticket}, ticket.rig_id)[ticket.turn_id]
        if claimed is not None:
            _rigs_seen[claimed.turn.session.rig_id] = _where(claimed.turn.session.rig)
        return claimed

    return _claim_thread().submit(claim_one)


_listening: list[concurrent.futures.Future[None]] = []  # held: a task the loop alone refers to may be collected


def early_lane_listen(queues: Callable[[], list[str]]) -> None:
    """Start taking early tickets for the queues ``queues()`` names (the worker's consumed queues), on the loop."""
    _listening.append(loop.start(early_lane.listen(queues, early_send, early_claim)))


def _where(rig: Rig) -> tuple[str, str, str]:
    return rig.kind, rig.base_url, rig.api_key


def turn_run(turn_id: int) -> str:
    """Claim and run a turn once. Returns what happened (a second delivery of the task is a no-op)."""
    return turns_run([turn_id])[turn_id]


def turns_run(turn_ids: list[int], tickets: Any = None, rig_id: int | None = None) -> dict[int, str]:
    """Claim the turns a dispatch handed out together and run them at once on this process's loop; for each:
    "ran", or "not-claimed" when it was not waiting any more (a second delivery is a no-op).

    ``tickets``: the message's start tickets (inference/queue/tickets.py). A ticketed turn on a rig this process knows
    has its backend request sent before the claim, which runs beside it; the rest start once claimed. ``rig_id``:
    the rig the turns were handed to; the claim takes only those still handed to it."""
    ticketed = tickets_by_turn(tickets, turn_ids)
    early: dict[int, tuple[Claim, concurrent.futures.Future[None]]] = {}
    sent: list[concurrent.futures.Future[None]] = []
    for turn_id, ticket in ticketed.items():
        if (held := early_lane.take(ticket)) is not None:  # its request went out while the turn was stored
            early[turn_id] = held.claim, held.run
        elif ticket.early:
            continue  # its early request is held elsewhere (or was): that process claims it, else this claim starts it
        elif (seen := _rigs_seen.get(ticket.rig_id)) is not None:
            claim: Claim = concurrent.futures.Future()
            sent.append(concurrent.futures.Future())
            early[turn_id] = claim, loop.start(run_ticketed_turn(ticket, seen, claim, sent[-1]))
    # The claim waits until those requests are written: its ORM work holds the GIL, which would delay them. It still
    # ends long before a first token, which the backend sends after reading the whole prompt.
    concurrent.futures.wait(sent, timeout=SENT_WAIT_S)
    try:
        started = _claim_thread().submit(_claim, turn_ids, ticketed, rig_id).result()
    except BaseException as exc:
        for claim, _ in early.values():
            claim.set_exception(exc)
        raise
    for claimed in started.values():
        if claimed is not None:
            _rigs_seen[claimed.turn.session.rig_id] = _where(claimed.turn.session.rig)
    for turn_id, (claim, _) in early.items():
        claim.set_result(started[turn_id])
    runs = [run for _, run in early.values()]
    runs += [
        loop.start(run_claimed_turn(c.turn, c.messages, c.budget))
        for turn_id, c in started.items()
        if c is not None and turn_id not in early
    ]
    for run in runs:
        run.result()  # a run that breaks before the end is reaped later
    return {turn_id: "not-claimed" if started[turn_id] is None else "ran" for turn_id in turn_ids}


_claims: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_claims_lock = threading.Lock()


def _claim_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread of this process that claims turns, so one database connection, kept open between turns, serves
    every claim: opening a connection would sit on the turn's time to first token. Made again after a fork (a
    prefork pool's children)."""
    global _claims
    with _claims_lock:
        if _claims is None or _claims[0] != os.getpid():
            _claims = os.getpid(), concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rigdash-claim")
        return _claims[1]


def _claim(
    turn_ids: list[int], tickets: dict[int, StartTicket], rig_id: int | None
) -> dict[int, claims.ClaimedTurn | None]:
    close_old_connections()  # as Celery and Channels do around a unit of work: drop a connection past its age
    try:
        return gated(claims.turns_start)(turn_ids=turn_ids, worker=WORKER_ID, tickets=tickets, rig_id=rig_id)
    finally:
        close_old_connections()
