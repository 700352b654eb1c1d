"""Writes and side effects for chat sessions and turns. Views, consumers and tasks call these."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.http import Http404
from django.utils import timezone

from inference import dispatch, events, live, selectors
from inference.backends import backend_for
from inference.backends.base import BackendError, ModelInfo
from inference.models import ChatSession, Rig, Turn
from inference.tickets import StartTicket, ticket_agrees

if TYPE_CHECKING:
    from inference.quotas import Limits, QuotaExceeded, TurnBudget

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Model)


class InvalidInput(Exception):
    """Bad input from a user, with a message to show them and a machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# name -> (type, minimum, maximum): the only generation parameters passed to a backend.
PARAM_RULES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 0.0, 1.0),
    "max_tokens": (int, 1, 32_768),
    "seed": (int, 0, 2**31 - 1),
}


def params_validate(raw: Any) -> dict[str, Any]:
    if raw in (None, ""):
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput("bad_params", "params must be an object")
    clean: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in PARAM_RULES:
            raise InvalidInput("bad_params", f"unknown parameter {name!r}; allowed: {sorted(PARAM_RULES)}")
        kind, low, high = PARAM_RULES[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
            raise InvalidInput("bad_params", f"{name} must be a {kind.__name__}")
        if not low <= value <= high:
            raise InvalidInput("bad_params", f"{name} must be between {low:g} and {high:g}")
        clean[name] = kind(value)
    limit = settings.RIGDASH.max_reply_tokens
    if clean.get("max_tokens", 0) > limit:
        raise InvalidInput("bad_params", f"max_tokens is limited to {limit} on this server")
    return clean


def rig_models(rig: Rig) -> list[ModelInfo]:
    """The models the rig's backend serves now (raises BackendError when it cannot say)."""
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    return asyncio.run(backend.list_models())


def rig_ensure_default(*, base_url: str, name: str = "embedded", slots: int = 4) -> Rig:
    """The default rig (the embedded llama-server); its URL and slots follow LLAMA_SERVER_URL and LLAMA_SLOTS."""
    rig, created = Rig.objects.get_or_create(
        name=name,
        defaults={
            "kind": Rig.Kind.LLAMACPP,
            "base_url": base_url,
            "queue": f"rig.{name}",
            "is_default": True,
            "slots": slots,
        },
    )
    if not created and (rig.base_url, rig.slots) != (base_url, slots):
        rig.base_url, rig.slots = base_url, slots
        rig.save(update_fields=["base_url", "slots"])
    return rig


def session_create(*, owner: User, rig: Rig, model_name: str) -> ChatSession:
    if not rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {rig.name} is disabled")
    try:
        served = {model.name for model in rig_models(rig)}
    except BackendError as exc:
        raise InvalidInput("backend_unavailable", f"cannot reach rig {rig.name}: {exc}") from exc
    if model_name not in served:
        raise InvalidInput("unknown_model", f"rig {rig.name} does not serve a model named {model_name!r}")
    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)


def turn_submit(*, session: ChatSession, text: Any, params: Any = None) -> Turn:
    """Store a new turn and dispatch it in the same transaction; its Celery task goes once that is committed."""
    with transaction.atomic():
        lock_rows(ChatSession.objects.filter(pk=session.pk))  # one submit at a time per session
        busy, conversations = _sessions_read({session.pk})
        limits: dict[int, Limits] = {}
        turn = _turn_prepare(session=session, text=text, params=params, busy=busy, limits=limits)
        _turns_insert([turn])
        _turns_stored([turn], conversations=conversations, limits=limits)
    return turn


@dataclass(frozen=True)
class SubmitRequest:
    """One ``turn.send`` from a chat socket: the user sending it and the session it is for (checked again)."""

    user: Any
    session_id: int
    text: Any
    params: Any = None


SubmitResult = Turn | InvalidInput | Http404 | dispatch.QueueUnavailable  # a submit's turn, or why it has none


def turn_submit_many(requests: Sequence[SubmitRequest]) -> list[SubmitResult]:
    """Store a burst of submits and dispatch them in one transaction; after it, announce and send them together.

    Each request gets its own result: its turn, or the error that refused it, or ``QueueUnavailable`` for a turn
    stored while the task queue is down (it waits for the queue). One request's error loses
    nothing of the others (``_turn_prepare`` refuses before it writes). A burst of n submits costs one INSERT,
    one commit, one dispatch and one round trip of announcements instead of n of each, and reads its sessions,
    their running turns and their owners' limits once (docs/benchmarks.md, level 3)."""
    results: list[SubmitResult] = []
    try:
        _turns_submit_atomic(requests, results)
    except dispatch.QueueUnavailable as exc:  # the commit's Celery message failed: the turns are stored and wait
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
        limits: dict[int, Limits] = {}
        for request in requests:
            # No savepoint per request: _turn_prepare refuses a turn before it writes anything, so a refusal leaves
            # nothing of its own behind (two round trips saved per submit).
            try:
                session = sessions.get((request.user.pk, request.session_id))
                if session is None:
                    raise Http404("No such chat session")  # another user's looks exactly like a missing one
                results.append(
                    _turn_prepare(session=session, text=request.text, params=request.params, busy=busy, limits=limits)
                )
            except (InvalidInput, Http404) as exc:
                results.append(exc)
        turns = [r for r in results if isinstance(r, Turn)]
        _turns_insert(turns)
        _turns_stored(turns, conversations=conversations, limits=limits)


def _sessions_read(session_ids: set[int]) -> tuple[set[int], dict[int, list[dict[str, str]]]]:
    """The sessions with a turn waiting or running, and each session's conversation so far, in one query. A
    session takes one turn at a time, so a new turn's conversation is what was said before it, and the worker
    would read the same (``turns_with_history``): it goes in the turn's start ticket."""
    busy: set[int] = set()
    conversations: dict[int, list[dict[str, str]]] = {session_id: [] for session_id in session_ids}
    rows = Turn.objects.filter(session_id__in=session_ids).order_by("created_at", "id")
    for session_id, status, user_text, reply_text in rows.values_list(
        "session_id", "status", "user_text", "reply_text"
    ):
        if status in Turn.ACTIVE:
            busy.add(session_id)
        conversations[session_id].extend(Turn.history_messages(user_text, reply_text))
    return busy, conversations


def locking(queryset: QuerySet[M]) -> QuerySet[M]:
    """The queryset, reading its own table's rows ``FOR UPDATE`` (inside a transaction). Not on SQLite, which has
    no row locks: there a transaction holds the database's write lock from its BEGIN (``transaction_mode``
    IMMEDIATE in settings), so the clause would only cost time."""
    return queryset.select_for_update(of=("self",)) if connection.features.has_select_for_update else queryset


def lock_rows(queryset: QuerySet[Any]) -> None:
    """Lock the rows (see ``locking``); on SQLite this issues nothing."""
    if connection.features.has_select_for_update:
        list(locking(queryset).values_list("pk", flat=True))


def _turn_prepare(*, session: ChatSession, text: Any, params: Any, busy: set[int], limits: dict[int, Limits]) -> Turn:
    """Check one turn and return it unsaved (``_turns_insert`` stores it); call inside a transaction, with the
    session's row read with ``locking`` (one submit at a time per session). ``busy``: the sessions known to have
    a turn waiting or running (updated here); ``limits``: owners' limits read so far in this transaction (updated
    here).

    Every check comes before the first write (a new session's title), so a refusal (InvalidInput) leaves nothing
    behind and a burst's other turns commit without a savepoint around each (``turn_submit_many``)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("empty_message", "The message is empty.")
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise InvalidInput("message_too_long", f"The message has {len(text)} characters; the limit is {limit}.")
    clean_params = params_validate(params)
    if not session.rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {session.rig.name} is disabled")
    from inference import quotas  # it imports this module

    if session.pk in busy:
        raise InvalidInput("turn_in_progress", "Wait for the current reply to finish (or stop it) first.")
    quotas.quota_check_submit(session=session, text=text, params=clean_params, known=limits)
    if not session.title:
        session.title = text.strip()[:80]
        ChatSession.objects.filter(pk=session.pk).update(title=session.title)
    busy.add(session.pk)
    return Turn(session=session, user_text=text, params=clean_params)


def _turns_insert(turns: list[Turn]) -> None:
    """Store checked turns in one INSERT. With one INSERT per turn, a burst of sixteen submits (the benchmark's
    level 3) took 15-17 ms to store on SQLite and 29-35 on PostgreSQL; with one for the burst, 11-12 and 20-25
    (``python -m bench.store``, docs/benchmarks.md). Both return the new ids from a bulk insert (SQLite since
    3.35); a database that cannot gets one INSERT per turn."""
    if connection.features.can_return_rows_from_bulk_insert:
        Turn.objects.bulk_create(turns)
    else:
        for turn in turns:
            turn.save()


def _turns_stored(
    turns: Sequence[Turn],
    *,
    conversations: Mapping[int, list[dict[str, str]]] | None = None,
    limits: Mapping[int, Limits] | None = None,
) -> None:
    """Inside the submit's transaction: hand the turns to their rigs' fair queues, in the same commit. After it:
    tell the pages, send the Celery tasks, show the turns on the board, in that order. ``conversations`` (by
    session) and ``limits`` (by owner), as this transaction read them, make the turns' start tickets."""
    if not turns:
        return
    from inference import board  # it imports this module

    # A page hears of its turn before a worker can start it: a fast backend's first token could otherwise
    # reach the page before the turn itself did (seen in the benchmark's stress level). Callbacks run in the
    # order they were added, so this goes before the dispatch's tasks.
    queued = [(turn.session_id, selectors.turn_snapshot(turn, just_stored=True)) for turn in turns]
    transaction.on_commit(lambda: events.turns_queued_sync(queued), robust=True)  # a view: never stops the tasks
    # The turns wait in their rig's fair queue; dispatch hands them to Celery while a slot is free.
    tickets = _start_tickets(turns, conversations or {}, limits or {})
    for rig in {turn.session.rig_id: turn.session.rig for turn in turns}.values():
        dispatch.rig_dispatch(rig_id=rig.pk, rig=rig, tickets=tickets)
    turn_ids = [turn.pk for turn in turns]
    transaction.on_commit(lambda: board.publish_turns(turn_ids), robust=True)


def _start_tickets(
    turns: Sequence[Turn], conversations: Mapping[int, list[dict[str, str]]], limits: Mapping[int, Limits]
) -> dict[int, StartTicket]:
    """Start tickets (inference/tickets.py) for turns just stored, where this transaction read their conversation
    and their owner's limits, and the owner has no daily allowance (its reservation needs the owner's row lock
    at the start)."""
    from inference import quotas  # it imports this module

    tickets: dict[int, StartTicket] = {}
    for turn in turns:
        mine = limits.get(turn.session.owner_id)
        if mine is None or mine.max_output_tokens_per_day is not None or turn.session_id not in conversations:
            continue
        tickets[turn.pk] = StartTicket(
            turn_id=turn.pk,
            rig_id=turn.session.rig_id,
            model=turn.session.model_name,
            messages=[*conversations[turn.session_id], {"role": "user", "content": turn.user_text}],
            params=turn.params,
            max_tokens=quotas.reply_cap(turn, mine),
            context_limit=mine.max_context_tokens,
        )
    return tickets


def turn_cancel(*, turn: Turn) -> Turn:
    """Stop a turn: a queued one ends at once; a running one is flagged and its worker closes the stream."""
    ended = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.CANCELLED, finish_reason="cancelled", cancel_requested=True, finished_at=timezone.now()
    )
    if ended:
        turn.refresh_from_db()
        dispatch.turn_released(turn_id=turn.pk, rig_id=turn.session.rig_id)
        events.turn_end_sync(session_id=turn.session_id, turn=selectors.turn_snapshot(turn), seq=0)
        return turn
    flagged = Turn.objects.filter(pk=turn.pk, status__in=Turn.RUNNING).update(cancel_requested=True)
    if flagged:
        live.request_cancel(turn.pk)
    else:
        raise InvalidInput("turn_finished", "That turn has already finished.")
    turn.refresh_from_db()
    return turn


@dataclass(frozen=True)
class ClaimedTurn:
    """A turn this worker claimed, with what its backend request needs."""

    turn: Turn  # with its session and rig
    messages: list[dict[str, str]]  # its conversation up to and including its user message
    budget: TurnBudget | InvalidInput  # its reserved token cap, or why it cannot run (a quota that leaves it none)


def turns_start(
    *, turn_ids: Sequence[int], worker: str, tickets: Mapping[int, StartTicket] | None = None
) -> dict[int, ClaimedTurn | None]:
    """Claim queued turns for this worker and reserve each reply's token cap; for each id its ``ClaimedTurn``,
    or None if it was not waiting any more (another delivery of its task claimed it, or it was cancelled). A
    turn that a quota leaves no tokens is claimed all the same and ends as failed with that reason. A ticketed
    turn (``tickets``, by turn id) is claimed with its ticket's cap and conversation (``_turns_claim_ticketed``)."""
    tickets = tickets or {}
    started: dict[int, ClaimedTurn | None] = dict.fromkeys(turn_ids)
    if ticketed := [t for t in turn_ids if t in tickets]:
        started.update(_turns_claim_ticketed(tickets=[tickets[t] for t in ticketed], worker=worker))
    if rest := [t for t in turn_ids if t not in tickets]:
        started.update(_turns_start_from_read(turn_ids=rest, worker=worker))
    return started


def _turn_claim_values(worker: str) -> dict[str, Any]:
    now = timezone.now()
    return {"status": Turn.Status.PROMPT, "worker": worker, "started_at": now, "heartbeat_at": now}


def _turns_claim_ticketed(*, tickets: Sequence[StartTicket], worker: str) -> dict[int, ClaimedTurn | None]:
    """Claim ticketed turns: one conditional UPDATE per distinct cap, then one read of what this claim got, with
    sessions and rigs. The worker's request already went out (starts.run_ticketed_turn), so neither is on the
    turn's time to first token. A turn whose ticket says otherwise than that read (a bug, or a message changed
    on its way) is claimed and fails, rather than run a prompt it was not given."""
    from inference import quotas  # it imports this module

    claim = _turn_claim_values(worker)
    waiting = Turn.objects.filter(status=Turn.Status.QUEUED, cancel_requested=False)
    by_cap: dict[int, list[int]] = {}
    for ticket in tickets:
        by_cap.setdefault(ticket.max_tokens, []).append(ticket.turn_id)
    claimed_any = False
    for cap, ids in by_cap.items():
        claimed_any = bool(waiting.filter(pk__in=ids).update(token_cap=cap, **claim)) or claimed_any
    started: dict[int, ClaimedTurn | None] = {ticket.turn_id: None for ticket in tickets}
    if not claimed_any:
        return started
    by_id = {ticket.turn_id: ticket for ticket in tickets}
    mine = Turn.objects.filter(pk__in=list(by_id), worker=worker, started_at=claim["started_at"])
    for turn in mine.select_related("session", "session__rig"):
        ticket = by_id[turn.pk]
        budget: TurnBudget | InvalidInput = quotas.TurnBudget(
            max_tokens=ticket.max_tokens, context_limit=ticket.context_limit
        )
        if not ticket_agrees(ticket, turn):
            log.error("turn %s: its start ticket does not match the stored turn; not run", turn.pk)
            budget = InvalidInput("ticket_mismatch", "This turn could not start (its task did not match it).")
        started[turn.pk] = ClaimedTurn(turn=turn, messages=ticket.messages, budget=budget)
    return started


def _turns_start_from_read(*, turn_ids: Sequence[int], worker: str) -> dict[int, ClaimedTurn | None]:
    """Claim turns without tickets: read them, their conversations and their owners' limits, then claim.

    This is on these turns' time to first token, so it takes as few round trips as it can: one read for the
    turns with their sessions, rigs and earlier turns; one per owner for their limits; then one conditional
    UPDATE per distinct token cap that claims the turns and reserves their caps at once (it needs no
    transaction of its own: what it claimed is what it updated). A turn whose owner has a daily allowance is
    claimed and capped in a transaction of its own with the owner's row locked (``quotas.turn_token_cap``),
    since each reservation shrinks what is left for the next. Before, a start took seven round trips, 5 ms of
    the 17 ms from a submit to the backend request (docs/benchmarks.md)."""
    from inference import quotas  # it imports this module

    started: dict[int, ClaimedTurn | None] = dict.fromkeys(turn_ids)
    turns, history = turns_with_history(turn_ids)
    turns = [turn for turn in turns if turn.status == Turn.Status.QUEUED and not turn.cancel_requested]
    limits = {owner_id: quotas.limits_for(owner_id) for owner_id in {turn.session.owner_id for turn in turns}}
    claim = _turn_claim_values(worker)
    now = claim["started_at"]
    waiting = Turn.objects.filter(status=Turn.Status.QUEUED, cancel_requested=False)
    budgets: dict[int, TurnBudget | QuotaExceeded] = {}
    by_cap: dict[int, list[Turn]] = {}
    for turn in turns:
        mine = limits[turn.session.owner_id]
        if mine.max_output_tokens_per_day is not None:
            with transaction.atomic():
                if not waiting.filter(pk=turn.pk).update(**claim):
                    continue
                try:
                    budgets[turn.pk] = quotas.turn_token_cap(turn=turn)
                except quotas.QuotaExceeded as exc:
                    budgets[turn.pk] = exc
        else:
            by_cap.setdefault(quotas.reply_cap(turn, mine), []).append(turn)
    for cap, group in by_cap.items():
        ids = [turn.pk for turn in group]
        claimed = waiting.filter(pk__in=ids).update(token_cap=cap, **claim)
        if 0 < claimed < len(ids):  # some were claimed or cancelled since the read: which are this worker's?
            ids = list(Turn.objects.filter(pk__in=ids, worker=worker, started_at=now).values_list("pk", flat=True))
        elif not claimed:
            ids = []
        for turn in group:
            if turn.pk in ids:
                turn.token_cap = cap
                budgets[turn.pk] = quotas.TurnBudget(
                    max_tokens=cap, context_limit=limits[turn.session.owner_id].max_context_tokens
                )
    for turn in turns:
        if turn.pk in budgets:
            for name, value in claim.items():
                setattr(turn, name, value)
            started[turn.pk] = ClaimedTurn(turn=turn, messages=history[turn.pk], budget=budgets[turn.pk])
    return started


def turn_mark_decoding(*, turn_id: int) -> None:
    Turn.objects.filter(pk=turn_id, status=Turn.Status.PROMPT).update(status=Turn.Status.DECODING)


def turn_checkpoint(*, turn_id: int, reply_text: str) -> None:
    Turn.objects.filter(pk=turn_id, status__in=Turn.RUNNING).update(reply_text=reply_text, heartbeat_at=timezone.now())


@dataclass
class TurnOutcome:
    status: str
    reply_text: str
    finish_reason: str
    stats: dict[str, Any]
    error: str = ""


def turn_finish(*, turn: Turn, outcome: TurnOutcome) -> bool:
    """Store a running turn's end once; False if it had already ended (e.g. reaped as interrupted)."""
    updated = Turn.objects.filter(pk=turn.pk, status__in=Turn.RUNNING).update(
        status=outcome.status,
        reply_text=outcome.reply_text,
        finish_reason=outcome.finish_reason,
        stats=outcome.stats,
        error=outcome.error,
        finished_at=timezone.now(),
        prompt_tokens=_prompt_in_context(outcome.stats),
        output_tokens=outcome.stats.get("output_tokens", outcome.stats.get("output_events")),
    )
    return bool(updated)


def _prompt_in_context(stats: dict[str, Any]) -> int | None:
    """The prompt's whole size: the backend's prompt_tokens count only what it did not have cached."""
    if stats.get("prompt_tokens") is None:
        return None
    return int(stats["prompt_tokens"]) + int(stats.get("cached_tokens") or 0)


def turns_with_history(turn_ids: Sequence[int]) -> tuple[list[Turn], dict[int, list[dict[str, str]]]]:
    """The turns (with their sessions and rigs), and each one's conversation up to and including its user
    message, oldest first, by turn id: one query, which reads every turn of their sessions."""
    rows = (
        Turn.objects.filter(session__turns__pk__in=turn_ids)
        .select_related("session", "session__rig")
        .order_by("created_at", "id")
    )
    by_session: dict[int, dict[int, Turn]] = {}
    # A session holding two of the turns comes twice: each row is kept once (a DISTINCT would compare every column).
    for row in rows:
        by_session.setdefault(row.session_id, {}).setdefault(row.pk, row)
    wanted = set(turn_ids)
    turns = sorted(
        (row for session_turns in by_session.values() for row in session_turns.values() if row.pk in wanted),
        key=lambda t: t.pk,
    )
    history: dict[int, list[dict[str, str]]] = {}
    for turn in turns:
        messages: list[dict[str, str]] = []
        for previous in by_session[turn.session_id].values():
            if previous.pk != turn.pk and previous.created_at <= turn.created_at:
                messages.extend(previous.as_history_messages())
        messages.append({"role": "user", "content": turn.user_text})
        history[turn.pk] = messages
    return turns, history


def turn_reap_stale(*, older_than_s: float) -> list[int]:
    """End running turns whose worker stopped checkpointing as ``interrupted``, keeping their text."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    reaped = []
    for turn in Turn.objects.filter(status__in=Turn.RUNNING, heartbeat_at__lt=cutoff).select_related("session"):
        current = live.snapshot(turn.pk)
        outcome = TurnOutcome(
            status=Turn.Status.INTERRUPTED,
            reply_text=current.text or turn.reply_text,
            finish_reason="interrupted",
            stats={**turn.stats, "output_events": current.seq},
            error="The worker running this turn stopped; the reply so far is kept.",
        )
        if turn_finish(turn=turn, outcome=outcome):
            turn.refresh_from_db()
            dispatch.turn_released(turn_id=turn.pk, rig_id=turn.session.rig_id)
            events.turn_end_sync(session_id=turn.session_id, turn=selectors.turn_snapshot(turn), seq=current.seq)
            live.forget(turn.pk)
            reaped.append(turn.pk)
            log.warning("turn %s interrupted: no heartbeat since %s", turn.pk, turn.heartbeat_at)
    return reaped
