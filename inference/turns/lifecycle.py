"""A turn's life after its submit: cancel, the worker's phase and checkpoint writes, its end, its release, the reaper.

Every state change is a conditional UPDATE that acts only when it matched (a task delivered twice is harmless).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from inference import events
from inference.backends.base import without_nul
from inference.errors import InvalidInput
from inference.live import agents, progress, state
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch, ratelimits
from inference.turns import board_rows, selectors

log = logging.getLogger(__name__)


def turn_cancel(*, turn: Turn) -> Turn:
    """Stop a turn: a queued one ends at once; a running one is flagged and its worker closes the stream."""
    ended = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.CANCELLED, finish_reason="cancelled", cancel_requested=True, finished_at=timezone.now()
    )
    if ended:
        turn.refresh_from_db()
        turn_released(turn_id=turn.pk, rig_id=turn.rig_id or turn.session.rig_id)
        events.turn_end_sync(session_id=turn.session_id, turn=selectors.turn_snapshot(turn), seq=0)
        return turn
    flagged = Turn.objects.filter(pk=turn.pk, status__in=Turn.RUNNING).update(cancel_requested=True)
    if flagged:
        state.request_cancel(turn.pk)
    else:
        raise InvalidInput("turn_finished", "That turn has already finished.")
    turn.refresh_from_db()
    return turn


def turns_cancel_for_user(*, user_id: int) -> int:
    """Cancel every waiting or running turn of the user (they were deactivated); how many were cancelled."""
    cancelled = 0
    for turn in Turn.objects.select_related("session").filter(session__owner_id=user_id, status__in=Turn.ACTIVE):
        try:
            turn_cancel(turn=turn)
            cancelled += 1
        except InvalidInput:  # it ended meanwhile
            continue
    return cancelled


def turn_mark_decoding(*, turn: Turn) -> None:
    """The turn's first token is out. On a router that swaps models (``Rig.server_models_max``) its model is loaded
    now, so the turns its swap held back go out at once, not at the next turn's end (inference/queue/swaps.py)."""
    started = Turn.objects.filter(pk=turn.pk, status=Turn.Status.PROMPT).update(status=Turn.Status.DECODING)
    rig_id = turn.rig_id or turn.session.rig_id
    if started and Rig.objects.filter(pk=rig_id, server_models_max__isnull=False).exists():
        dispatch.rig_dispatch(rig_id=rig_id)


def turn_checkpoint(*, turn_id: int, reply_text: str, thinking_text: str = "") -> None:
    Turn.objects.filter(pk=turn_id, status__in=Turn.RUNNING).update(
        reply_text=reply_text, thinking_text=thinking_text, heartbeat_at=timezone.now()
    )


@dataclass
class TurnOutcome:
    status: str
    reply_text: str
    finish_reason: str
    stats: dict[str, Any]
    error: str = ""
    thinking_text: str = ""


def turn_finish(*, turn: Turn, outcome: TurnOutcome) -> bool:
    """Store a running turn's end once; False if it had already ended (e.g. reaped as interrupted)."""
    updated = Turn.objects.filter(pk=turn.pk, status__in=Turn.RUNNING).update(
        status=outcome.status,
        reply_text=without_nul(outcome.reply_text),  # the worker's chunks have none; a backend's words may
        thinking_text=without_nul(outcome.thinking_text),
        finish_reason=without_nul(outcome.finish_reason),
        stats=without_nul(outcome.stats),
        error=without_nul(outcome.error),
        finished_at=timezone.now(),
        prompt_tokens=_prompt_in_context(outcome.stats),
        output_tokens=outcome.stats.get("output_tokens", outcome.stats.get("output_events")),
    )
    tokens = int(outcome.stats.get("output_tokens", outcome.stats.get("output_events")) or 0)
    if updated and tokens > 0:  # the reply's tokens count in its owner's and its key's per-minute windows
        owner = ChatSession.objects.filter(pk=turn.session_id).values_list("owner_id", "api_key_id").first()
        if owner is not None:
            ratelimits.turn_tokens_count(user_id=owner[0], key_id=owner[1], tokens=tokens)
    return bool(updated)


def _prompt_in_context(stats: dict[str, Any]) -> int | None:
    """The prompt's whole size: the backend's prompt_tokens count only what it did not have cached."""
    if stats.get("prompt_tokens") is None:
        return None
    return int(stats["prompt_tokens"]) + int(stats.get("cached_tokens") or 0)


def turn_reap_stale(*, older_than_s: float) -> list[int]:
    """End running turns whose worker stopped checkpointing as ``interrupted``, keeping their text. Each turn is
    reaped on its own: one that fails (Redis down, an odd live list, a database error) is logged and tried again at
    the next pass, and the others are reaped all the same."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    reaped = []
    for turn in Turn.objects.filter(status__in=Turn.RUNNING, heartbeat_at__lt=cutoff).select_related("session"):
        try:
            if _reap_one(turn):
                reaped.append(turn.pk)
        except Exception:
            log.exception("turn %s: reaping failed; the next pass tries again", turn.pk)
    return reaped


def _reap_one(turn: Turn) -> bool:
    try:
        current = state.snapshot(turn.pk)
        text, seq = current.text or turn.reply_text, current.seq
        thinking = current.thinking or turn.thinking_text
    except Exception:  # the live list cannot be read: the last checkpoint is the reply
        log.exception("turn %s: live text unreadable; ending it with its last checkpoint", turn.pk)
        text, seq = turn.reply_text, int(turn.stats.get("output_events", 0) or 0)
        thinking = turn.thinking_text
    outcome = TurnOutcome(
        status=Turn.Status.INTERRUPTED,
        reply_text=text,
        thinking_text=thinking,
        finish_reason="interrupted",
        stats={**turn.stats, "output_events": seq},
        error="The worker running this turn stopped; the reply so far is kept.",
    )
    if not turn_finish(turn=turn, outcome=outcome):
        return False
    log.warning("turn %s interrupted: no heartbeat since %s", turn.pk, turn.heartbeat_at)
    turn.refresh_from_db()
    # The turn has ended in the database: what follows only tells others, and one failing skips none of the rest.
    steps: list[Callable[[], object]] = [
        lambda: turn_released(turn_id=turn.pk, rig_id=turn.rig_id or turn.session.rig_id),
        lambda: events.turn_end_sync(session_id=turn.session_id, turn=selectors.turn_snapshot(turn), seq=seq),
        lambda: state.forget(turn.pk),
    ]
    for step in steps:
        try:
            step()
        except Exception:
            log.exception("turn %s: a step after its end failed", turn.pk)
    return True


def turn_released(*, turn_id: int, rig_id: int) -> None:
    """A turn ended (or was cancelled while waiting): show it on the board and give its slot to the next."""
    board_rows.publish_turn(turn_id)
    progress.forget(turn_id)
    dispatch.rig_dispatch(rig_id=rig_id)


def turns_fail_where_agent_down() -> list[int]:
    """Fail the waiting turns of rigs whose agent (which serves the rig's queue) has been down for longer than
    RIGDASH_AGENT_DOWN_FAIL_S, those that waited that long: a clear end instead of a wait with no end. So too the
    turns of chats placed by a model that no rig serving it could take for that long."""
    limit_s = settings.RIGDASH.agent_down_fail_s
    now = timezone.now()
    failed: list[int] = []
    for rig in Rig.objects.filter(enabled=True).exclude(agent_key=""):
        agent = agents.agent_state(rig.pk, rig.agent_key, now=now.timestamp())
        if agent.up or (agent.last_seen is not None and now.timestamp() - agent.last_seen < limit_s):
            continue
        message = f"Rig {rig.name} cannot run this turn: its {agent.describe()}. Try again when it is back."
        # Its own turns and those handed to it; a placed turn still waiting may go to another rig (below).
        stale = Turn.objects.filter(rig=rig, status=Turn.Status.QUEUED, created_at__lt=now - timedelta(seconds=limit_s))
        failed += [t.pk for t in stale.select_related("session") if _fail_waiting(t, "agent_down", message, rig.pk)]
    placed = Turn.objects.filter(
        rig__isnull=True,
        session__placement=ChatSession.Placement.MODEL,
        status=Turn.Status.QUEUED,
        created_at__lt=now - timedelta(seconds=limit_s),
    )
    for turn in placed.select_related("session"):
        if reason := dispatch.turn_waiting_reason(turn):
            message = f"No rig can run this turn ({reason.removeprefix('waiting: ')}). Try again later."
            if _fail_waiting(turn, "no_rig", message, turn.session.rig_id):
                failed.append(turn.pk)
    return failed


def _fail_waiting(turn: Turn, finish_reason: str, message: str, rig_id: int) -> bool:
    """End a turn that still waits as failed with ``message``; False when it started or ended meanwhile."""
    ended = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.FAILED, finish_reason=finish_reason, error=message, finished_at=timezone.now()
    )
    if ended:
        turn.refresh_from_db()
        turn_released(turn_id=turn.pk, rig_id=rig_id)
        events.turn_end_sync(session_id=turn.session_id, turn=selectors.turn_snapshot(turn), seq=0)
    return bool(ended)
