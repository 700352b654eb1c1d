"""A worker's claim of the turns a task hands it: a conditional UPDATE per token cap, so a turn runs once, and the
reservation of each reply's token cap (inference/queue/quotas.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from inference.errors import InvalidInput, QuotaExceeded
from inference.models import Turn
from inference.queue import quotas
from inference.queue.quotas import TurnBudget
from inference.queue.tickets import StartTicket, ticket_agrees
from inference.turns.selectors import turns_with_history

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedTurn:
    """A turn this worker claimed, with what its backend request needs."""

    turn: Turn  # with its session and rig
    messages: list[dict[str, Any]]  # its conversation up to and including its user message
    budget: TurnBudget | InvalidInput  # its reserved token cap, or why it cannot run (a quota that leaves it none)


def turns_start(
    *,
    turn_ids: Sequence[int],
    worker: str,
    tickets: Mapping[int, StartTicket] | None = None,
    rig_id: int | None = None,
) -> dict[int, ClaimedTurn | None]:
    """Claim queued turns for this worker and reserve each reply's token cap; for each id its ``ClaimedTurn``,
    or None if it was not waiting any more (another delivery of its task claimed it, or it was cancelled, or, with
    ``rig_id``, the rig its task was sent to, it has since been handed to another rig). A turn that a quota leaves
    no tokens is claimed all the same and ends as failed with that reason. A ticketed turn (``tickets``, by turn id)
    is claimed with its ticket's cap and conversation (``_turns_claim_ticketed``)."""
    tickets = tickets or {}
    waiting = Turn.objects.filter(status=Turn.Status.QUEUED, cancel_requested=False)
    if rig_id is not None:
        waiting = waiting.filter(rig_id=rig_id)
    started: dict[int, ClaimedTurn | None] = dict.fromkeys(turn_ids)
    if ticketed := [t for t in turn_ids if t in tickets]:
        started.update(_turns_claim_ticketed(tickets=[tickets[t] for t in ticketed], worker=worker, waiting=waiting))
    if rest := [t for t in turn_ids if t not in tickets]:
        started.update(_turns_start_from_read(turn_ids=rest, worker=worker, waiting=waiting, rig_id=rig_id))
    return started


def _turn_claim_values(worker: str) -> dict[str, Any]:
    now = timezone.now()
    return {"status": Turn.Status.PROMPT, "worker": worker, "started_at": now, "heartbeat_at": now}


def _turns_claim_ticketed(
    *, tickets: Sequence[StartTicket], worker: str, waiting: QuerySet[Turn]
) -> dict[int, ClaimedTurn | None]:
    """Claim ticketed turns: one conditional UPDATE per distinct cap, then one read of what this claim got, with
    sessions and rigs. The worker's request already went out (``start.run_ticketed_turn``), so neither is on
    the turn's time to first token. A turn whose ticket says otherwise than that read (a bug, or a message changed
    on its way) is claimed and fails, rather than run a prompt it was not given."""

    claim = _turn_claim_values(worker)
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
        budget: TurnBudget | InvalidInput = TurnBudget(max_tokens=ticket.max_tokens, context_limit=ticket.context_limit)
        if not ticket_agrees(ticket, turn):
            log.error("turn %s: its start ticket does not match the stored turn; not run", turn.pk)
            budget = InvalidInput("ticket_mismatch", "This turn could not start (its task did not match it).")
        started[turn.pk] = ClaimedTurn(turn=turn, messages=ticket.messages, budget=budget)
    return started


def _turns_start_from_read(
    *, turn_ids: Sequence[int], worker: str, waiting: QuerySet[Turn], rig_id: int | None
) -> dict[int, ClaimedTurn | None]:
    """Claim turns without tickets: read them, their conversations and their owners' limits, then claim.

    This is on these turns' time to first token, so it takes as few round trips as it can: one read for the
    turns with their sessions, rigs and earlier turns; one per owner for their limits; then one conditional
    UPDATE per distinct token cap that claims the turns and reserves their caps at once (it needs no
    transaction of its own: what it claimed is what it updated). A turn whose owner has a daily allowance is
    claimed and capped in a transaction of its own with the owner's row locked (``quotas.turn_token_cap``),
    since each reservation shrinks what is left for the next."""

    started: dict[int, ClaimedTurn | None] = dict.fromkeys(turn_ids)
    turns, history = turns_with_history(turn_ids)
    turns = [
        turn
        for turn in turns
        if turn.status == Turn.Status.QUEUED and not turn.cancel_requested and rig_id in (None, turn.rig_id)
    ]
    limits = {owner_id: quotas.limits_for(owner_id) for owner_id in {turn.session.owner_id for turn in turns}}
    claim = _turn_claim_values(worker)
    now = claim["started_at"]
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
                except QuotaExceeded as exc:
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
                budgets[turn.pk] = TurnBudget(
                    max_tokens=cap, context_limit=limits[turn.session.owner_id].max_context_tokens
                )
    for turn in turns:
        if turn.pk in budgets:
            for name, value in claim.items():
                setattr(turn, name, value)
            started[turn.pk] = ClaimedTurn(turn=turn, messages=history[turn.pk], budget=budgets[turn.pk])
    return started
