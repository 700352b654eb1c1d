"""Rate limits: requests and reply tokens per sliding minute, per user (everything they send) and per API key (each
key on its own), configured on the quotas (``Quota.RATE_FIELDS``, merged as the other limits are: the user's own,
else the most generous group's, else the default) and counted in Redis (``inference.live.ratewindow``).

A submit is checked, and counted, in ``rate_check_submit`` (``inference.turns.submit``); a turn's reply tokens are
counted when it ends (``turn_tokens_count``, from ``inference.turns.lifecycle.turn_finish``). A token limit refuses
the next request once the minute's tokens reached it (a reply that is running is not cut).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from inference.errors import QuotaExceeded
from inference.live import ratewindow
from inference.models import ChatSession, Quota

log = logging.getLogger(__name__)
LIMIT_WORDS = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "reply tokens per minute",
    "key_requests_per_minute": "requests per minute through this API key",
    "key_tokens_per_minute": "reply tokens per minute through this API key",
}


class RateLimited(QuotaExceeded):
    """Refused by a rate limit: ``retry_after_s`` is when the window has room; ``kind`` is OpenAI's error type
    (``requests`` or ``tokens``)."""

    def __init__(self, limit: str, message: str, retry_after_s: int) -> None:
        super().__init__(limit, message, resets_at=timezone.now() + timedelta(seconds=retry_after_s))
        self.retry_after_s = retry_after_s
        self.kind = "tokens" if "tokens" in limit else "requests"


@dataclass(frozen=True)
class RateLimits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    key_requests_per_minute: int | None = None
    key_tokens_per_minute: int | None = None


def rate_merge(rows: list[dict[str, Any]], user_id: int) -> RateLimits:
    """Field by field: the user's own quota's, else the most generous of their groups', else the default quota's.
    ``rows``: the quota rows that apply to the user, with ``user_id``, ``group_id`` and ``Quota.RATE_FIELDS``."""
    merged: dict[str, int | None] = {}
    for name in Quota.RATE_FIELDS:
        own = next((r[name] for r in rows if r["user_id"] == user_id), None)
        groups = [r[name] for r in rows if r["group_id"] is not None and r[name] is not None]
        default = next((r[name] for r in rows if r["user_id"] is None and r["group_id"] is None), None)
        merged[name] = own if own is not None else max(groups) if groups else default
    return RateLimits(**merged)


def rate_limits_for(user_id: int) -> RateLimits:
    """The user's rate limits (one query; a submit reads them with the other limits, ``quotas.limits_for``)."""
    mine = Q(user_id=user_id) | Q(group__user__id=user_id) | Q(user__isnull=True, group__isnull=True)
    return rate_merge(list(Quota.objects.filter(mine).values("user_id", "group_id", *Quota.RATE_FIELDS).distinct()),
                      user_id)  # fmt: skip


def _windows(limits: RateLimits, user_id: int, key_id: int | None) -> list[tuple[str, ratewindow.Window]]:
    wanted = [
        ("requests_per_minute", "user", user_id, "r"),
        ("tokens_per_minute", "user", user_id, "t"),
        ("key_requests_per_minute", "key", key_id, "r"),
        ("key_tokens_per_minute", "key", key_id, "t"),
    ]
    return [
        (name, ratewindow.Window(ratewindow.window_key(scope, owner, kind), kind, limit))
        for name, scope, owner, kind in wanted
        if (limit := getattr(limits, name)) is not None and owner is not None
    ]


def rate_check_submit(*, session: ChatSession, limits: RateLimits | None = None) -> None:
    """Admit one turn of ``session``'s owner (and its API key) or raise RateLimited; an admitted turn counts."""
    limits = rate_limits_for(session.owner_id) if limits is None else limits
    named = _windows(limits, session.owner_id, session.api_key_id)
    if not named:
        return
    refused, retry_ms = ratewindow.admit([w for _, w in named])
    if refused is None:
        return
    name = next(n for n, w in named if w is refused)
    retry_s = max(1, math.ceil(retry_ms / 1000))
    ratewindow.refusal_count(f"{'key' if name.startswith('key_') else 'user'}:{name.removeprefix('key_')}")
    raise RateLimited(
        name,
        f"Rate limit reached: {refused.limit} {LIMIT_WORDS[name]}. Try again in {retry_s} s.",
        retry_after_s=retry_s,
    )


def turn_tokens_count(*, user_id: int, key_id: int | None, tokens: int) -> None:
    """Count a finished turn's reply tokens in its owner's and its key's token windows (always: a limit set later
    sees the minute's tokens). Never raises: Redis down must not stop a turn's end."""
    keys = [ratewindow.window_key("user", user_id, "t")]
    if key_id is not None:
        keys.append(ratewindow.window_key("key", key_id, "t"))
    try:
        ratewindow.tokens_add(keys, tokens)
    except Exception:
        log.exception("counting %s reply tokens of user %s for rate limits failed", tokens, user_id)


def usage_now(*, user_id: int) -> dict[str, int]:
    """The user's requests and reply tokens in the last minute (the quotas page)."""
    return {
        "requests": ratewindow.window_usage(ratewindow.window_key("user", user_id, "r"), "r"),
        "tokens": ratewindow.window_usage(ratewindow.window_key("user", user_id, "t"), "t"),
    }


def board_rate_view(rows: list[Quota]) -> dict[str, int]:
    """For the quotas page: each user quota's last-minute usage (``rate_usage`` on the row) and the refusals so far;
    Redis down shows nothing rather than failing the page."""
    try:
        for row in rows:
            row.rate_usage = usage_now(user_id=row.user_id) if row.user_id else None  # type: ignore[attr-defined]
        return ratewindow.refusals()
    except Exception:
        log.exception("reading rate-limit windows for the quotas page failed")
        return {}
