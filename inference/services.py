"""Writes and side effects for chat sessions and turns. Views, consumers and tasks call these."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from inference import dispatch, events, live, selectors
from inference.backends import backend_for
from inference.backends.base import BackendError, ModelInfo
from inference.models import ChatSession, Rig, Turn

if TYPE_CHECKING:
    from inference.quotas import Limits, QuotaExceeded, TurnBudget

log = logging.getLogger(__name__)


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
    """Store a new turn and queue it on the rig's Celery queue once the row is committed."""
    with transaction.atomic():
        turn = _turn_store(session=session, text=text, params=params)
    _turns_stored([turn])
    return turn


@dataclass(frozen=True)
class SubmitRequest:
    """One ``turn.send`` from a chat socket: the user sending it and the session it is for (checked again)."""

    user: Any
    session_id: int
    text: Any
    params: Any = None


def turn_submit_many(requests: Sequence[SubmitRequest]) -> list[Turn | InvalidInput | Http404]:
    """Store a burst of submits in one transaction, then announce and dispatch them together.

    Each request gets its own result: its turn, or the error that refused it. One request's error loses
    nothing of the others (each is stored under its own savepoint). A burst of n submits costs one commit,
    one dispatch and one round trip of announcements instead of n of each, and reads its sessions, their
    running turns and their owners' limits once (docs/benchmarks.md, level 3)."""
    results: list[Turn | InvalidInput | Http404] = []
    with transaction.atomic():
        sessions: dict[tuple[int, int], ChatSession] = {}
        for user in {request.user for request in requests}:
            asked = [r.session_id for r in requests if r.user == user and isinstance(r.session_id, int)]
            for found in selectors.session_list_for(user).filter(pk__in=asked):
                sessions[(user.pk, found.pk)] = found
        busy = set(
            Turn.objects.filter(session_id__in={s.pk for s in sessions.values()}, status__in=Turn.ACTIVE).values_list(
                "session_id", flat=True
            )
        )
        limits: dict[int, Limits] = {}
        for request in requests:
            try:
                session = sessions.get((request.user.pk, request.session_id))
                if session is None:
                    raise Http404("No such chat session")  # another user's looks exactly like a missing one
                with transaction.atomic():
                    results.append(
                        _turn_store(session=session, text=request.text, params=request.params, busy=busy, limits=limits)
                    )
            except (InvalidInput, Http404) as exc:
                results.append(exc)
    _turns_stored([r for r in results if isinstance(r, Turn)])
    return results


def lock_rows(queryset: QuerySet[Any]) -> None:
    """``SELECT ... FOR UPDATE`` the rows, inside a transaction. Not on SQLite, which has no row locks: there a
    transaction holds the database's write lock from its BEGIN (``transaction_mode`` IMMEDIATE in settings), so
    the query would only cost time."""
    if connection.features.has_select_for_update:
        list(queryset.select_for_update().values_list("pk", flat=True))


def _turn_store(
    *,
    session: ChatSession,
    text: Any,
    params: Any,
    busy: set[int] | None = None,
    limits: dict[int, Limits] | None = None,
) -> Turn:
    """Check and store one turn; call inside a transaction (it locks the session's row). ``busy``: the sessions
    known to have a turn waiting or running (updated here); ``limits``: owners' limits already read."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("empty_message", "The message is empty.")
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise InvalidInput("message_too_long", f"The message has {len(text)} characters; the limit is {limit}.")
    clean_params = params_validate(params)
    if not session.rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {session.rig.name} is disabled")
    from inference import quotas  # it imports this module

    lock_rows(ChatSession.objects.filter(pk=session.pk))  # one submit at a time per session
    in_progress = session.pk in busy if busy is not None else session.turns.filter(status__in=Turn.ACTIVE).exists()
    if in_progress:
        raise InvalidInput("turn_in_progress", "Wait for the current reply to finish (or stop it) first.")
    quotas.quota_check_submit(session=session, text=text, params=clean_params, known=limits)
    turn = Turn.objects.create(session=session, user_text=text, params=clean_params)
    if not session.title:
        session.title = text.strip()[:80]
        ChatSession.objects.filter(pk=session.pk).update(title=session.title)
    if busy is not None:
        busy.add(session.pk)
    turn.session = session
    return turn


def _turns_stored(turns: Sequence[Turn]) -> None:
    """After the commit: tell the pages, hand the turns to their rigs' fair queues, show them on the board."""
    if not turns:
        return
    from inference import board  # it imports this module

    # A page hears of its turn before a worker can start it: a fast backend's first token could otherwise
    # reach the page before the turn itself did (seen in the benchmark's stress level).
    events.turns_queued_sync([(turn.session_id, selectors.turn_snapshot(turn, just_stored=True)) for turn in turns])
    # The turns wait in their rig's fair queue; dispatch hands them to Celery while a slot is free.
    for rig_id in dict.fromkeys(turn.session.rig_id for turn in turns):
        dispatch.rig_dispatch(rig_id=rig_id)
    board.publish_turns([turn.pk for turn in turns])


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


def turns_start(*, turn_ids: Sequence[int], worker: str) -> dict[int, tuple[Turn, TurnBudget | QuotaExceeded] | None]:
    """Claim queued turns for this worker and reserve each reply's token cap, all in one transaction.

    For each id: the turn and its ``quotas.TurnBudget``, or the ``quotas.QuotaExceeded`` that leaves it no
    tokens (the turn is claimed all the same and ends as failed with that reason); None if it was not waiting
    any more (another delivery of its task claimed it, or it was cancelled). A worker handed several turns at
    once claims them together: one write lock and one commit instead of one each (docs/benchmarks.md)."""
    from inference import quotas  # it imports this module

    started: dict[int, tuple[Turn, TurnBudget | QuotaExceeded] | None] = dict.fromkeys(turn_ids)
    with transaction.atomic():
        now = timezone.now()
        Turn.objects.filter(pk__in=started, status=Turn.Status.QUEUED, cancel_requested=False).update(
            status=Turn.Status.PROMPT, worker=worker, started_at=now, heartbeat_at=now
        )
        # Those this update claimed: a turn claimed before (by any worker) has another worker or start time.
        mine = Turn.objects.filter(pk__in=started, status=Turn.Status.PROMPT, worker=worker, started_at=now)
        turns = list(mine.select_related("session", "session__rig").order_by("pk"))
        budgets = quotas.turn_token_caps(turns)
    for turn in turns:
        started[turn.pk] = turn, budgets[turn.pk]
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


def turns_history_messages(turns: Sequence[Turn]) -> dict[int, list[dict[str, str]]]:
    """Each turn's conversation up to and including its user message, oldest first, by turn id; one query."""
    wanted = {turn.pk: turn for turn in turns}
    earlier: dict[int, list[Turn]] = {turn.session_id: [] for turn in turns}
    for previous in Turn.objects.filter(session_id__in=earlier).order_by("created_at", "id"):
        earlier[previous.session_id].append(previous)
    history: dict[int, list[dict[str, str]]] = {}
    for turn_id, turn in wanted.items():
        messages: list[dict[str, str]] = []
        for previous in earlier[turn.session_id]:
            if previous.pk != turn_id and previous.created_at <= turn.created_at:
                messages.extend(previous.as_history_messages())
        messages.append({"role": "user", "content": turn.user_text})
        history[turn_id] = messages
    return history


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
