"""Reads: what a user may see (owner-scoped: another user's object is ``NotFound``), and the shapes sent to browsers
and JSON clients."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import F, Q, QuerySet

from inference.errors import InvalidInput, NotFound
from inference.live import state
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch

HISTORY_LIMIT = 200


def rig_list_enabled() -> QuerySet[Rig]:
    return Rig.objects.filter(enabled=True)


def session_list_for(user: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    """The user's chats; not the requests of a key that stores nothing (``ChatSession.hidden``)."""
    return ChatSession.objects.filter(owner_id=user.pk, hidden=False).select_related("rig")


CHAT_PAGE = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class ChatPage:
    sessions: list[ChatSession]
    older: str | None  # the cursor of the next page of older chats; None on the last page


def chat_cursor(session: ChatSession) -> str:
    """The cursor of the page of chats older than ``session``."""
    return f"{(session.updated_at - _EPOCH) // _MICROSECOND}-{session.pk}"


def _parse_cursor(before: str) -> tuple[datetime, int]:
    micros, _, pk = before.partition("-")
    if not (micros.isascii() and micros.isdigit() and len(micros) <= 18 and _valid_id(pk)):
        raise InvalidInput("bad_cursor", "That page of chats does not exist: the list starts again at the newest.")
    return _EPOCH + int(micros) * _MICROSECOND, int(pk)


def session_page_for(user: AbstractBaseUser | AnonymousUser, *, before: str = "") -> ChatPage:
    """The user's chats, newest first, CHAT_PAGE at a time: ``before`` is the cursor a previous page gave. Keyset on
    (updated_at, id), so a deep page costs what the first does and a chat active meanwhile moves to the top instead
    of shifting the pages. A cursor that is not one raises InvalidInput."""
    chats = session_list_for(user).order_by("-updated_at", "-pk")
    if before:
        at, pk = _parse_cursor(before)
        chats = chats.filter(Q(updated_at__lt=at) | Q(updated_at=at, pk__lt=pk))
    page = list(chats[: CHAT_PAGE + 1])
    return ChatPage(page[:CHAT_PAGE], chat_cursor(page[CHAT_PAGE - 1]) if len(page) > CHAT_PAGE else None)


MAX_ID = 2**63 - 1  # a bigint primary key


def _valid_id(value: Any) -> bool:
    """A primary key as a browser may send it: an int (or its digits) in the bigint range, nothing else."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


def session_get_for(user: AbstractBaseUser | AnonymousUser, session_id: int) -> ChatSession:
    """The user's own session, or NotFound: another user's id looks exactly like one that does not exist."""
    if not _valid_id(session_id):
        raise NotFound("chat session")
    try:
        return session_list_for(user).get(pk=session_id)
    except (ChatSession.DoesNotExist, ValueError, TypeError):
        raise NotFound("chat session") from None


def turn_get_for(user: AbstractBaseUser | AnonymousUser, turn_id: int) -> Turn:
    if not _valid_id(turn_id):
        raise NotFound("turn")
    try:
        return Turn.objects.select_related("session").get(pk=turn_id, session__owner_id=user.pk)
    except (Turn.DoesNotExist, ValueError, TypeError):
        raise NotFound("turn") from None


def turn_snapshot(turn: Turn, *, just_stored: bool = False) -> dict[str, Any]:
    """A turn as browsers see it. A running turn's text comes from the live buffer, with its seq.

    ``just_stored``: the turn was created a moment ago and not yet dispatched, so it has no text and no place
    in the queue yet (dispatch announces it next): the snapshot is built without asking Redis or computing
    the queue. That keeps four round trips off the path from a submit to the worker's start."""
    text, thinking, seq = turn.reply_text, turn.thinking_text, turn.stats.get("output_events", 0)
    if just_stored:
        position = None
    else:
        if turn.is_active:
            current = state.snapshot(turn.pk)
            text, thinking, seq = current.text, current.thinking, current.seq
        position = dispatch.queue_position(turn)
    return {
        "id": turn.pk,
        "session": turn.session_id,
        "user_text": turn.user_text,
        "reply": text,
        "thinking": thinking,
        "seq": seq,
        "status": turn.status,
        "finish_reason": turn.finish_reason,
        "error": turn.error,
        "stats": turn_stats_public(turn.stats),
        "created_at": turn.created_at.isoformat() if turn.created_at else None,
        "queue_position": position,  # None unless waiting; 0 starting; n: n-1 turns wait ahead of it
        "queue_ahead": None if position is None else max(0, position - 1),
        # Handed to the queue (0) and still unclaimed: no worker may consume it, which the page is told too.
        "waiting_reason": _waiting_reason(turn) if position is not None else "",
        "rig": _rig_name(turn),  # the rig running or that ran it; None while a placed chat's turn waits for one
    }


def _waiting_reason(turn: Turn) -> str:
    """Why a waiting turn cannot start now: its rig cannot take it, or a model swap holds it back."""
    return dispatch.turns_waiting_reasons([turn]).get(turn.pk, "")


def _rig_name(turn: Turn) -> str | None:
    if turn.rig_id is None:
        return None
    if turn.rig_id == turn.session.rig_id:  # the chat's rig, which the callers have loaded
        return turn.session.rig.name
    return turn.rig.name if turn.rig is not None else None


def turn_stats_public(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats for the page: everything but the long list of inter-token gaps and the backend's error detail (backend
    URLs, file paths: staff read it in the admin)."""
    return {key: value for key, value in stats.items() if key not in PRIVATE_STATS}


PRIVATE_STATS = frozenset({"inter_token_gaps_ms", "error_detail"})


def session_history(session: ChatSession) -> list[dict[str, Any]]:
    turns = list(session.turns.order_by("-created_at", "-id")[:HISTORY_LIMIT])
    turns.reverse()
    for turn in turns:
        turn.session = session
    return [turn_snapshot(turn) for turn in turns]


def turns_with_history(turn_ids: Sequence[int]) -> tuple[list[Turn], dict[int, list[dict[str, Any]]]]:
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
    history: dict[int, list[dict[str, Any]]] = {}
    for turn in turns:
        messages: list[dict[str, Any]] = list(turn.session.context_messages)  # an API request's earlier messages
        for previous in by_session[turn.session_id].values():
            if previous.pk != turn.pk and previous.created_at <= turn.created_at:
                messages.extend(previous.as_history_messages())
        messages.append(turn.prompt_message())
        history[turn.pk] = messages
    return turns, history


# Reads for monitoring/ (its only way into inference/ besides models, backends, live state and events).


@functools.lru_cache(maxsize=256)
def _active_turns_query(rig_id: int) -> QuerySet[Turn, Any]:
    """The rig's active turns' query, built once per rig and never evaluated itself (building it costs more CPU
    than running it, once a second per rig)."""
    return (
        # Its own chats' turns and those handed to it; a placed chat's turn still waiting for a rig is on none.
        Turn.objects.filter(
            Q(rig_id=rig_id) | Q(rig__isnull=True, session__rig_id=rig_id, session__placement="rig"),
            status__in=Turn.ACTIVE,
        )
        .order_by("created_at")
        .values("id", "status", "session__owner__username", "session__model_name")
    )


def rig_active_turns(rig_id: int) -> list[dict[str, Any]]:
    """The rig's queued and running turns, oldest first, with what the rig's page draws of each (every sample holds
    them, and every dashboard of the rig gets each sample)."""
    rows = _active_turns_query(rig_id).all()  # a fresh copy each tick: the cached one never holds results
    return [
        {
            "id": row["id"],
            "status": row["status"],
            "user": row["session__owner__username"],
            "model": row["session__model_name"],
        }
        for row in rows
    ]


def rig_recent_finished(rig_id: int, *, limit: int) -> list[dict[str, Any]]:
    """The rig's most recently finished turns that have timings, oldest first: id, owner_id, finished_at, stats."""
    recent = list(
        Turn.objects.filter(rig_id=rig_id, finished_at__isnull=False, stats__has_key="ttft_ms")
        .order_by("-finished_at")
        .values("id", "finished_at", "stats", owner_id=F("session__owner_id"))[:limit]
    )
    recent.reverse()
    return [dict(row) for row in recent]
