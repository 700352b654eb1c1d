"""Reads: what a user may see, and the shapes sent to browsers and JSON clients."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404

from inference import dispatch, live
from inference.models import ChatSession, Rig, Turn

HISTORY_LIMIT = 200


def rig_list_enabled() -> QuerySet[Rig]:
    return Rig.objects.filter(enabled=True)


def session_list_for(user: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    return ChatSession.objects.filter(owner_id=user.pk).select_related("rig")


def session_get_for(user: AbstractBaseUser | AnonymousUser, session_id: int) -> ChatSession:
    """The user's own session, or 404: another user's id looks exactly like one that does not exist."""
    try:
        return session_list_for(user).get(pk=session_id)
    except (ChatSession.DoesNotExist, ValueError, TypeError):
        raise Http404("No such chat session") from None


def turn_get_for(user: AbstractBaseUser | AnonymousUser, turn_id: int) -> Turn:
    try:
        return Turn.objects.select_related("session").get(pk=turn_id, session__owner_id=user.pk)
    except (Turn.DoesNotExist, ValueError, TypeError):
        raise Http404("No such turn") from None


def turn_snapshot(turn: Turn, *, just_stored: bool = False) -> dict[str, Any]:
    """A turn as browsers see it. A running turn's text comes from the live buffer, with its seq.

    ``just_stored``: the turn was created a moment ago and not yet dispatched, so it has no text and no place
    in the queue yet (dispatch announces it next): the snapshot is built without asking Redis or computing
    the queue. That keeps four round trips off the path from a submit to the worker's start."""
    text, seq = turn.reply_text, turn.stats.get("output_events", 0)
    if just_stored:
        position = None
    else:
        if turn.is_active:
            current = live.snapshot(turn.pk)
            text, seq = current.text, current.seq
        position = dispatch.queue_position(turn)
    return {
        "id": turn.pk,
        "session": turn.session_id,
        "user_text": turn.user_text,
        "reply": text,
        "seq": seq,
        "status": turn.status,
        "finish_reason": turn.finish_reason,
        "error": turn.error,
        "stats": turn_stats_public(turn.stats),
        "created_at": turn.created_at.isoformat() if turn.created_at else None,
        "queue_position": position,  # None unless waiting; 0 starting; n: n-1 turns wait ahead of it
        "queue_ahead": None if position is None else max(0, position - 1),
    }


def turn_stats_public(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats for the page: everything but the long list of inter-token gaps."""
    return {key: value for key, value in stats.items() if key != "inter_token_gaps_ms"}


def session_history(session: ChatSession) -> list[dict[str, Any]]:
    turns = list(session.turns.order_by("-created_at", "-id")[:HISTORY_LIMIT])
    turns.reverse()
    for turn in turns:
        turn.session = session
    return [turn_snapshot(turn) for turn in turns]
