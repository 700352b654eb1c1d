"""A user's new turn: checked, stored and dispatched in one transaction; announced and sent to Celery after it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from inference import events
from inference.backends.base import without_nul
from inference.db import lock_rows, locking
from inference.errors import InvalidInput, NotFound, QueueUnavailable
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch, placement, quotas, ratelimits
from inference.queue.early import EarlyStart, fits
from inference.queue.quotas import Limits
from inference.queue.tickets import StartTicket
from inference.turns import board_rows, selectors
from inference.turns.params import one_answer, turn_params

log = logging.getLogger(__name__)


def turn_submit(
    *, session: ChatSession, text: Any, params: Any = None, new_session: bool = False, early: EarlyStart | None = None
) -> Turn:
    """Store a new turn and dispatch it in the same transaction; its Celery task goes once that is committed.

    ``new_session``: the session was created in the caller's transaction, so no other submit can see it and it has
    no turns: its row is not locked and its turns are not read, and no savepoint is taken (a refusal rolls the
    caller's whole transaction back, session included): four round trips fewer. ``early``: the early ticket sent for
    this turn (inference/queue/early.py); its ``taken`` says whether the turn's task names it."""
    with transaction.atomic(savepoint=not new_session):
        busy: set[int]
        conversations: dict[int, list[dict[str, Any]]]
        if new_session:
            busy, conversations = set(), {session.pk: []}
        else:
            lock_rows(ChatSession.objects.filter(pk=session.pk))  # one submit at a time per session
            busy, conversations = _sessions_read({session.pk})
        conversations[session.pk][:0] = session.context_messages
        limits: dict[int, Limits] = {}
        serving: dict[str, list[Rig]] = {}
        turn = _turn_prepare(session=session, text=text, params=params, busy=busy, limits=limits, serving=serving)
        _turns_insert([turn])
        _turns_stored([turn], conversations=conversations, limits=limits, serving=serving, new_sessions=new_session,
                      early=early)  # fmt: skip
    return turn


@dataclass(frozen=True)
class SubmitRequest:
    """One ``turn.send`` from a chat socket: the user sending it and the session it is for (checked again)."""

    user: Any
    session_id: int
    text: Any
    params: Any = None


SubmitResult = Turn | InvalidInput | QueueUnavailable  # a submit's turn, or why it has none


def turn_submit_many(requests: Sequence[SubmitRequest]) -> list[SubmitResult]:
    """Store a burst of submits and dispatch them in one transaction; after it, announce and send them together.

    Each request gets its own result: its turn, or the error that refused it, or ``QueueUnavailable`` for a turn
    stored while the task queue is down (it waits for the queue). One request's error loses
    nothing of the others (``_turn_prepare`` refuses before it writes). A burst of n submits costs one INSERT,
    one commit, one dispatch and one round trip of announcements instead of n of each, and reads its sessions,
    their running turns and their owners' limits once."""
    results: list[SubmitResult] = []
    try:
        _turns_submit_atomic(requests, results)
    except QueueUnavailable as exc:  # the commit's Celery message failed: the turns are stored and wait
        return [exc if isinstance(result, Turn) else result for result in results]  # a refusal keeps its reason
    return results


def _turns_submit_atomic(requests: Sequence[SubmitRequest], results: list[SubmitResult]) -> None:
    """``turn_submit_many``'s transaction. Each request's result goes in ``results`` as it is known, so the caller
    still has them when the commit's Celery message fails (Django raises that out of the atomic block)."""
    with transaction.atomic():
        sessions: dict[tuple[int, int], ChatSession] = {}
        for user in {request.user for request in requests}:
            asked = [r.session_id for r in requests if r.user == user and isinstance(r.session_id, int)]
            # Read and locked at once (one submit at a time per session): _turn_prepare need not lock them again.
            for found in locking(selectors.session_list_for(user).filter(pk__in=asked).order_by()):
                sessions[(user.pk, found.pk)] = found
        busy, conversations = _sessions_read({s.pk for s in sessions.values()})
        for found in sessions.values():
            conversations[found.pk][:0] = found.context_messages
        limits: dict[int, Limits] = {}
        serving: dict[str, list[Rig]] = {}
        for request in requests:
            # No savepoint per request: _turn_prepare refuses a turn before it writes anything, so a refusal leaves
            # nothing of its own behind (two round trips saved per submit).
            try:
                session = sessions.get((request.user.pk, request.session_id))
                if session is None:
                    raise NotFound("chat session")  # another user's looks exactly like a missing one
                pending = sum(1 for r in results if isinstance(r, Turn) and r.session.owner_id == session.owner_id)
                results.append(
                    _turn_prepare(
                        session=session,
                        text=request.text,
                        params=request.params,
                        busy=busy,
                        limits=limits,
                        pending=pending,
                        serving=serving,
                    )
                )
            except InvalidInput as exc:
                results.append(exc)
            except (ValueError, TypeError, ArithmeticError) as exc:  # input no check foresaw: this submit's alone
                log.warning("submit refused: %r", exc)
                results.append(InvalidInput("bad_request", "This message could not be stored."))
        turns = [r for r in results if isinstance(r, Turn)]
        _turns_insert(turns)
        _turns_stored(turns, conversations=conversations, limits=limits, serving=serving)


def _sessions_read(session_ids: set[int]) -> tuple[set[int], dict[int, list[dict[str, Any]]]]:
    """The sessions with a turn waiting or running, and each session's conversation so far, in one query. A
    session takes one turn at a time, so a new turn's conversation is what was said before it, and the worker
    would read the same (``turns_with_history``): it goes in the turn's start ticket."""
    busy: set[int] = set()
    conversations: dict[int, list[dict[str, Any]]] = {session_id: [] for session_id in session_ids}
    rows = Turn.objects.filter(session_id__in=session_ids).order_by("created_at", "id")
    for session_id, status, user_text, reply_text in rows.values_list(
        "session_id", "status", "user_text", "reply_text"
    ):
        if status in Turn.ACTIVE:
            busy.add(session_id)
        conversations[session_id].extend(Turn.history_messages(user_text, reply_text))
    return busy, conversations


def _turn_prepare(
    *,
    session: ChatSession,
    text: Any,
    params: Any,
    busy: set[int],
    limits: dict[int, Limits],
    serving: dict[str, list[Rig]],
    pending: int = 0,
) -> Turn:
    """Check one turn and return it unsaved (``_turns_insert`` stores it); call inside a transaction, with the
    session's row read with ``locking`` (one submit at a time per session). ``busy``: the sessions known to have
    a turn waiting or running (updated here); ``limits``: owners' limits read so far in this transaction (updated
    here); ``serving``: the rigs serving each placed chat's model, as this transaction read them (updated here);
    ``pending``: the owner's turns this transaction accepted before this one (not inserted yet).

    Every check comes before the first write (a new session's title), so a refusal (InvalidInput) leaves nothing
    behind and a burst's other turns commit without a savepoint around each (``turn_submit_many``)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("empty_message", "The message is empty.")
    text, params = without_nul(text), without_nul(params)  # as PostgreSQL can store them
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise InvalidInput("message_too_long", f"The message has {len(text)} characters; the limit is {limit}.")
    clean_params = turn_params(session=session, raw=params)  # the chat's settings, then the turn's own
    placed = session.placement == placement.PLACED
    if placed and not _serving(serving, session.model_name):
        raise InvalidInput("no_rig_serves_model", f"No enabled rig serves {session.model_name} now.")
    if not placed and not session.rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {session.rig.name} is disabled")

    if session.pk in busy:
        raise InvalidInput("turn_in_progress", "Wait for the current reply to finish (or stop it) first.")
    quotas.quota_check_submit(session=session, text=text, params=clean_params, known=limits, pending=pending)
    # Last: an admitted turn counts in the minute's window. Its limits came with the others (quotas.limits_for).
    ratelimits.rate_check_submit(session=session, limits=limits[session.owner_id].rate)
    if not session.title:
        session.title = text.strip()[:80]
        ChatSession.objects.filter(pk=session.pk).update(title=session.title)
    busy.add(session.pk)
    # A placed chat's turn gets its rig when one takes it (inference/queue/placement.py).
    return Turn(session=session, rig=None if placed else session.rig, user_text=text, params=clean_params)


def _serving(serving: dict[str, list[Rig]], model: str) -> list[Rig]:
    """The enabled rigs serving ``model``, read once per transaction (``serving`` keeps them by model)."""
    if model not in serving:
        serving[model] = placement.rigs_serving(model)
    return serving[model]


def _turns_insert(turns: list[Turn]) -> None:
    """Store checked turns in one INSERT (``python -m bench.store`` measures it). PostgreSQL and SQLite (3.35+)
    return the new ids from a bulk insert; a database that cannot gets one INSERT per turn."""
    if connection.features.can_return_rows_from_bulk_insert:
        Turn.objects.bulk_create(turns)
    else:
        for turn in turns:
            turn.save()


def _turns_stored(
    turns: Sequence[Turn],
    *,
    conversations: Mapping[int, list[dict[str, Any]]] | None = None,
    limits: Mapping[int, Limits] | None = None,
    serving: dict[str, list[Rig]] | None = None,
    new_sessions: bool = False,
    early: EarlyStart | None = None,
) -> None:
    """Inside the submit's transaction: hand the turns to their rigs' fair queues, in the same commit. After it:
    tell the pages, send the Celery tasks, show the turns on the board, in that order. ``conversations`` (by
    session), ``limits`` (by owner) and ``serving`` (by model), as this transaction read them, make the turns'
    start tickets and choose placed turns' rigs. ``new_sessions``: the turns' sessions were made in this
    transaction, so no page can be watching them yet: the tasks go first."""
    if not turns:
        return

    # A page hears of its turn before a worker can start it: a fast backend's first token could otherwise
    # reach the page before the turn itself did (seen in the benchmark's stress level). Callbacks run in the
    # order they were added, so this goes before the dispatch's tasks, unless no page can have the session open.
    queued = [(turn.session_id, selectors.turn_snapshot(turn, just_stored=True)) for turn in turns]

    def announce() -> None:
        events.turns_queued_sync(queued)

    if not new_sessions:
        transaction.on_commit(announce, robust=True)  # a view: never stops the tasks
    # The turns wait in their rig's fair queue; dispatch hands them to Celery while a slot is free.
    tickets = _start_tickets(turns, conversations or {}, limits or {})
    named = False  # the turn's ticket names its early ticket (the early request asks for what the turn does)
    if early is not None and (ticket := tickets.get(turns[0].pk)) is not None and fits(early.ticket, ticket):
        tickets[ticket.turn_id], named = replace(ticket, early=early.id), True
    found = serving if serving is not None else {}
    rigs = {rig.pk: rig for turn in turns if (rig := _first_rig(turn, found)) is not None}
    for rig_id in sorted(rigs):  # always in the same order: two submits never wait on each other's rig locks
        handed = dispatch.rig_dispatch(rig_id=rig_id, rig=rigs[rig_id], tickets=tickets)
        if early is not None and rig_id == early.ticket.rig_id:
            early.taken = named and turns[0].pk in handed
    if new_sessions:
        transaction.on_commit(announce, robust=True)
    turn_ids = [turn.pk for turn in turns]
    transaction.on_commit(lambda: board_rows.publish_turns(turn_ids), robust=True)


def _first_rig(turn: Turn, serving: dict[str, list[Rig]]) -> Rig | None:
    """The rig a new turn is offered to first: its chat's, or for a placed chat the best of the rigs serving its
    model that can take turns now (None: none can; the turn waits for one, and its page says why)."""
    if turn.session.placement != placement.PLACED:
        return turn.session.rig
    rigs = _serving(serving, turn.session.model_name)
    excluded = [rig.pk for rig in rigs if dispatch.cannot_take_turns(rig)]
    return placement.choose(rigs, excluded=excluded, model=turn.session.model_name)


def _start_tickets(
    turns: Sequence[Turn], conversations: Mapping[int, list[dict[str, Any]]], limits: Mapping[int, Limits]
) -> dict[int, StartTicket]:
    """Start tickets (inference/queue/tickets.py) for turns just stored, where this transaction read their conversation
    and their owner's limits, and the owner has no daily allowance (its reservation needs the owner's row lock
    at the start)."""

    tickets: dict[int, StartTicket] = {}
    for turn in turns:
        mine = limits.get(turn.session.owner_id)
        if mine is None or mine.max_output_tokens_per_day is not None or turn.session_id not in conversations:
            continue
        if one_answer(turn.params):  # no chat request to send before the claim
            continue
        tickets[turn.pk] = StartTicket(
            turn_id=turn.pk,
            rig_id=turn.session.rig_id,
            model=turn.session.model_name,
            messages=[*conversations[turn.session_id], turn.prompt_message()],
            params=turn.params,
            max_tokens=quotas.reply_cap(turn, mine),
            context_limit=mine.max_context_tokens,
        )
    return tickets
