"""Per-user and per-group quotas: which limits apply, what is used today, and the checks that refuse a turn.

Limits (``Quota`` fields, empty = none): concurrent turns, reply tokens per UTC day, tokens per reply,
context (prompt) tokens. They are checked when a turn is submitted (``quota_check_submit``, inside
``inference.turns.submit``'s transaction, with the user's row locked so two submits cannot both pass),
when it starts (``turn_token_cap``: the reply's ``max_tokens`` is capped by the per-reply limit and
what is left of today's allowance, and that cap is reserved until the turn ends) and when the backend
reports the prompt's real size (``context_check``).

A turn's tokens count on the UTC day it started. Daily allowances reset at 00:00 UTC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.backends import capabilities
from inference.db import lock_rows
from inference.errors import QuotaExceeded
from inference.models import ChatSession, Quota, Turn
from inference.queue.ratelimits import RateLimits, rate_merge
from inference.tokens import estimate_json_tokens, estimate_prompt_tokens, estimate_tokens

LIMIT_NAMES = {
    "max_concurrent_turns": "concurrent replies",
    "max_output_tokens_per_day": "reply tokens per day",
    "max_tokens_per_reply": "tokens per reply",
    "max_context_tokens": "context tokens",
}


@dataclass(frozen=True)
class Limits:
    max_concurrent_turns: int | None = None
    max_output_tokens_per_day: int | None = None
    max_tokens_per_reply: int | None = None
    max_context_tokens: int | None = None
    rate: RateLimits = field(default_factory=RateLimits)  # per minute, read in the same query (queue/ratelimits.py)

    def as_dict(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in Quota.LIMIT_FIELDS}


# Pure pieces -------------------------------------------------------------------------------------------


def limits_merge(
    *,
    own: Mapping[str, int | None] | None,
    groups: Iterable[Mapping[str, int | None]],
    default: Mapping[str, Any] | None,
) -> Limits:
    """Field by field: the user's own value; else the most generous of their groups'; else the default's."""
    groups = list(groups)
    merged: dict[str, int | None] = {}
    for name in Quota.LIMIT_FIELDS:
        value = own.get(name) if own else None
        if value is None:
            group_values = [g[name] for g in groups if g.get(name) is not None]
            value = max(group_values) if group_values else None  # type: ignore[type-var]
        if value is None and default:
            value = default.get(name)
        merged[name] = value
    return Limits(**merged)  # type: ignore[arg-type]  # LIMIT_FIELDS only: ``rate`` keeps its default


def day_start_utc(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def next_reset_utc(now: datetime) -> datetime:
    return day_start_utc(now) + timedelta(days=1)


def describe_reset(resets_at: datetime, now: datetime) -> str:
    left_min = max(1, math.ceil((resets_at - now).total_seconds() / 60))
    return f"It resets at {resets_at:%H:%M} UTC on {resets_at:%Y-%m-%d} (in {left_min // 60} h {left_min % 60} min)."


def context_check(*, prompt_tokens: int | None, limit: int | None, estimated: bool) -> None:
    if limit is None or prompt_tokens is None or prompt_tokens <= limit:
        return
    what = f"about {prompt_tokens} tokens (estimated)" if estimated else f"{prompt_tokens} tokens (the backend's count)"
    raise QuotaExceeded(
        "max_context_tokens",
        f"This conversation's prompt is {what}; your context limit is {limit} tokens. Start a new chat.",
    )


# Database reads ----------------------------------------------------------------------------------------


def limits_for(user_id: int) -> Limits:
    """The user's limits, from their own quota, their groups' and the default, read in one query (it runs at
    every submit and every start)."""
    mine = Q(user_id=user_id) | Q(group__user__id=user_id) | Q(user__isnull=True, group__isnull=True)
    fields = (*Quota.LIMIT_FIELDS, *Quota.RATE_FIELDS)
    rows = list(Quota.objects.filter(mine).values("user_id", "group_id", *fields).distinct().order_by("id"))
    own = next((r for r in rows if r["user_id"] == user_id), None)
    groups = [r for r in rows if r["group_id"] is not None]
    default = next((r for r in rows if r["user_id"] is None and r["group_id"] is None), None)
    return replace(limits_merge(own=own, groups=groups, default=default), rate=rate_merge(rows, user_id))


@dataclass(frozen=True)
class DailyUsage:
    output_tokens: int  # stored by turns started today that ended
    reserved_tokens: int  # caps granted to turns running now
    active_turns: int  # queued or running, any day


def usage_today(user_id: int, *, now: datetime | None = None, exclude_turn: int | None = None) -> DailyUsage:
    now = now or timezone.now()
    mine = Turn.objects.filter(session__owner_id=user_id)
    if exclude_turn is not None:
        mine = mine.exclude(pk=exclude_turn)
    today = mine.filter(started_at__gte=day_start_utc(now))
    used = reserved = 0
    for status, output_tokens, token_cap in today.values_list("status", "output_tokens", "token_cap"):
        if status in Turn.RUNNING:
            reserved += token_cap or 0
        else:
            used += output_tokens or 0
    active = mine.filter(status__in=Turn.ACTIVE).count()
    return DailyUsage(output_tokens=used, reserved_tokens=reserved, active_turns=active)


def truncating_window(session: ChatSession, turns: list[Turn], num_ctx: int | None) -> int | None:
    """The context window a rig whose server cuts an over-long prompt to fit (``Capabilities.truncates_to_window``:
    Ollama) reads this chat's next prompt in, where known: the turn's ``num_ctx`` (Ollama loads the model with it),
    else the one the chat's last turn ran with (its stats' ``context_limit``, from /api/ps). None on a server whose
    over-long prompt fails rather than being cut (llama-server)."""
    if not capabilities(session.rig.kind).truncates_to_window:
        return None
    if num_ctx:
        return int(num_ctx)
    return next((int(t.stats["context_limit"]) for t in reversed(turns) if (t.stats or {}).get("context_limit")), None)


def session_prompt_estimate(
    session: ChatSession,
    new_text: str,
    *,
    num_ctx: int | None = None,
    system: str = "",
    prefill: str = "",
    new_message: Mapping[str, Any] | None = None,
) -> int:
    """The next prompt's size, all the backend will read: the last measured prompt plus what was said since, or an
    estimate of it all with the system prompt (``system``: the chat's setting), and the reply's start (``prefill``)
    either way; ``new_message``: an API request's last message when it is more than a user's text. On an Ollama rig
    with a known window, no more than the window: Ollama drops the oldest messages to fit it (server/prompt.go
    chatPrompt), so that is all the model reads."""
    turns = list(session.turns.order_by("created_at", "id"))
    window = truncating_window(session, turns, num_ctx)
    measured = [i for i, t in enumerate(turns) if t.prompt_tokens is not None]
    base, rest = 0, turns
    if measured:
        last = turns[measured[-1]]
        base = (last.prompt_tokens or 0) + (last.output_tokens or estimate_tokens(last.reply_text))
        rest = turns[measured[-1] + 1 :]
    said = [m for t in rest for m in t.as_history_messages()] + [new_message or {"role": "user", "content": new_text}]
    # A measured prompt already held the system prompt; the prefill is this turn's own, so it counts every time.
    first = [{"role": "system", "content": system}] if system else []
    messages = [*first, *session.context_messages, *said] if not measured else said
    if prefill:
        messages.append({"role": "assistant", "content": prefill})
    estimate = base + estimate_prompt_tokens(messages)
    return min(estimate, window) if window else estimate


# Checks ------------------------------------------------------------------------------------------------


def quota_check_submit(
    *,
    session: ChatSession,
    text: str,
    params: Mapping[str, Any],
    known: dict[int, Limits] | None = None,
    pending: int = 0,
) -> None:
    """Refuse a new turn over any limit; call inside the submit's transaction (locks the user's row when they have
    a limit, so that two submits cannot both pass). ``known``: limits already read in this transaction, by user id
    (a burst of submits reads each once). ``pending``: the owner's turns this transaction accepted and has not
    inserted yet (a burst inserts them together): they count as active, so the check and the insert are under
    one lock."""
    known = {} if known is None else known
    if session.owner_id not in known:
        known[session.owner_id] = limits_for(session.owner_id)
    limits = known[session.owner_id]
    if replace(limits, rate=RateLimits()) == Limits():
        return  # nothing to count, so nothing to lock: one round trip less on the turn's way to its first token
    lock_rows(User.objects.filter(pk=session.owner_id))
    now = timezone.now()
    usage = usage_today(session.owner_id, now=now)
    active = usage.active_turns + pending
    if limits.max_concurrent_turns is not None and active >= limits.max_concurrent_turns:
        raise QuotaExceeded(
            "max_concurrent_turns",
            f"You have {active} replies running or waiting; your limit is "
            f"{limits.max_concurrent_turns} at once. Send again when one has finished.",
        )
    daily = limits.max_output_tokens_per_day
    if daily is not None and usage.output_tokens + usage.reserved_tokens >= daily:
        resets = next_reset_utc(now)
        raise QuotaExceeded(
            "max_output_tokens_per_day",
            f"You have used {usage.output_tokens + usage.reserved_tokens} of your {daily} reply tokens for today. "
            + describe_reset(resets, now),
            resets_at=resets,
        )
    per_reply = limits.max_tokens_per_reply
    if per_reply is not None and params.get("max_tokens", 0) > per_reply:
        raise QuotaExceeded(
            "max_tokens_per_reply", f"max_tokens {params['max_tokens']} is over your limit of {per_reply} per reply."
        )
    system, prefill = params.get("system") or "", params.get("prefill") or ""
    estimate = session_prompt_estimate(
        session, text, num_ctx=params.get("num_ctx"), system=system, prefill=prefill, new_message=params.get("message")
    )
    # An API request's tools are part of its prompt (the chat template writes them out); an embeddings request's
    # inputs are what it sends; an infill's files for context (llama-server's ``input_extra``) go before its prefix.
    passed = params.get("passthrough") or {}
    estimate += sum(estimate_json_tokens(passed.get(name)) for name in ("tools", "input", "input_extra"))
    context = limits.max_context_tokens
    if context is not None and system and estimate_tokens(system) > context:
        raise QuotaExceeded(
            "max_context_tokens",
            f"This chat's system prompt alone is about {estimate_tokens(system)} tokens (estimated); your context "
            f"limit is {context} tokens. Shorten the system prompt in the chat's settings.",
        )
    context_check(prompt_tokens=estimate, limit=context, estimated=True)


@dataclass(frozen=True)
class TurnBudget:
    max_tokens: int
    context_limit: int | None


def reply_cap(turn: Turn, limits: Limits) -> int:
    """The tokens a turn may reply with before any daily allowance: what it asked for (at most the server's cap),
    within the owner's per-reply limit."""
    server_max = settings.RIGDASH.max_reply_tokens
    wanted = min(int((turn.params or {}).get("max_tokens", server_max)), server_max)
    return min(wanted, limits.max_tokens_per_reply or wanted)


def turn_token_cap(*, turn: Turn) -> TurnBudget:
    """The ``max_tokens`` a starting turn may use, reserved on the turn; raises QuotaExceeded if none is left."""
    owner_id = turn.session.owner_id
    with transaction.atomic():
        lock_rows(User.objects.filter(pk=owner_id))  # one cap computed at a time per user
        limits = limits_for(owner_id)
        cap = reply_cap(turn, limits)
        daily = limits.max_output_tokens_per_day
        if daily is not None:
            now = timezone.now()
            usage = usage_today(owner_id, now=now, exclude_turn=turn.pk)
            left = daily - usage.output_tokens - usage.reserved_tokens
            if left <= 0:
                resets = next_reset_utc(now)
                raise QuotaExceeded(
                    "max_output_tokens_per_day",
                    f"Your {daily} reply tokens for today were used while this turn waited. "
                    + describe_reset(resets, now),
                    resets_at=resets,
                )
            cap = min(cap, left)
        Turn.objects.filter(Q(pk=turn.pk), Q(status__in=Turn.RUNNING)).update(token_cap=cap)
    turn.token_cap = cap
    return TurnBudget(max_tokens=cap, context_limit=limits.max_context_tokens)
