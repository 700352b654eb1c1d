"""Writes and side effects for chat sessions and turns. Views, consumers and tasks call these."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from inference import dispatch, events, live
from inference.backends import backend_for
from inference.backends.base import BackendError, ModelInfo
from inference.models import ChatSession, Rig, Turn
from inference.selectors import turn_snapshot

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
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("empty_message", "The message is empty.")
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise InvalidInput("message_too_long", f"The message has {len(text)} characters; the limit is {limit}.")
    clean_params = params_validate(params)
    if not session.rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {session.rig.name} is disabled")
    from inference import board, quotas  # they import this module

    with transaction.atomic():
        ChatSession.objects.select_for_update().get(pk=session.pk)  # one submit at a time per session
        if session.turns.filter(status__in=Turn.ACTIVE).exists():
            raise InvalidInput("turn_in_progress", "Wait for the current reply to finish (or stop it) first.")
        quotas.quota_check_submit(session=session, text=text, params=clean_params)
        turn = Turn.objects.create(session=session, user_text=text, params=clean_params)
        if not session.title:
            ChatSession.objects.filter(pk=session.pk).update(title=text.strip()[:80])
    turn.session = session
    # The page hears of the turn before a worker can start it: a fast backend's first token could otherwise
    # reach the page before the turn itself did (seen in the benchmark's stress level).
    events.turn_queued_sync(session_id=session.pk, turn=turn_snapshot(turn, just_stored=True))
    # The turn waits in the rig's fair queue; dispatch hands it to Celery when a slot is free.
    dispatch.rig_dispatch(rig_id=session.rig_id)
    board.publish_turn(turn.pk)
    return turn


def turn_cancel(*, turn: Turn) -> Turn:
    """Stop a turn: a queued one ends at once; a running one is flagged and its worker closes the stream."""
    ended = Turn.objects.filter(pk=turn.pk, status=Turn.Status.QUEUED).update(
        status=Turn.Status.CANCELLED, finish_reason="cancelled", cancel_requested=True, finished_at=timezone.now()
    )
    if ended:
        turn.refresh_from_db()
        dispatch.turn_released(turn_id=turn.pk, rig_id=turn.session.rig_id)
        events.turn_end_sync(session_id=turn.session_id, turn=turn_snapshot(turn), seq=0)
        return turn
    flagged = Turn.objects.filter(pk=turn.pk, status__in=Turn.RUNNING).update(cancel_requested=True)
    if flagged:
        live.request_cancel(turn.pk)
    else:
        raise InvalidInput("turn_finished", "That turn has already finished.")
    turn.refresh_from_db()
    return turn


def turn_claim(*, turn_id: int, worker: str) -> Turn | None:
    """Move a queued turn to ``prompt`` for this worker; None if another delivery already did."""
    now = timezone.now()
    claimed = Turn.objects.filter(pk=turn_id, status=Turn.Status.QUEUED, cancel_requested=False).update(
        status=Turn.Status.PROMPT, worker=worker, started_at=now, heartbeat_at=now
    )
    if not claimed:
        return None
    return Turn.objects.select_related("session", "session__rig").get(pk=turn_id)


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


def turn_history_messages(turn: Turn) -> list[dict[str, str]]:
    """The conversation up to and including this turn's user message, oldest first."""
    earlier = turn.session.turns.filter(created_at__lte=turn.created_at).exclude(pk=turn.pk)
    messages: list[dict[str, str]] = []
    for previous in earlier.order_by("created_at", "id"):
        messages.extend(previous.as_history_messages())
    messages.append({"role": "user", "content": turn.user_text})
    return messages


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
            events.turn_end_sync(session_id=turn.session_id, turn=turn_snapshot(turn), seq=current.seq)
            live.forget(turn.pk)
            reaped.append(turn.pk)
            log.warning("turn %s interrupted: no heartbeat since %s", turn.pk, turn.heartbeat_at)
    return reaped
