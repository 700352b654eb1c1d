"""The usage page's API keys: each key's turns, tokens and busy time over the range, the requests made without a key
(the chat pages) as one more row; a revoked or expired key still shows, as its usage happened. docs/admin.md, "Usage".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.utils import timezone

from inference.models import ApiKey
from inference.turns.usage import CHAT_PAGES, UsageRow, key_label
from inference.turns.usage_sums import KeySums


@dataclass(frozen=True)
class KeyUsageRow:
    key_id: int | None  # None: the chat pages
    label: str  # usage.key_label, or CHAT_PAGES
    owner: str
    state: str  # ApiKey.state: active | expired | revoked; "" for the chat pages
    turns: int
    prompt_tokens: int
    output_tokens: int
    busy_s: float


def key_usage(closed: Iterable[KeySums], live: Iterable[UsageRow], *, user_id: int | None) -> list[KeyUsageRow]:
    """Per key: the rolled-up days' sums (``closed``) and the live days' rows added up, the most reply tokens first.
    One query for the keys' names, only when there are keys; ``user_id``: only that user's keys are named."""
    totals: dict[int | None, list[float]] = {}
    for key_id, *sums in closed:
        _add(totals.setdefault(key_id, [0, 0, 0, 0.0]), sums)
    for row in live:
        _add(totals.setdefault(row.api_key_id, [0, 0, 0, 0.0]), (row.turns, row.prompt_tokens, row.output_tokens,
                                                                  row.busy_s))  # fmt: skip
    ids = [key_id for key_id in totals if key_id is not None]
    keys = ApiKey.objects.filter(pk__in=ids).select_related("owner") if ids else ApiKey.objects.none()
    named = {key.pk: key for key in (keys.filter(owner_id=user_id) if user_id is not None else keys)}
    now = timezone.now()
    rows = []
    for key_id, (turns, prompt, output, busy) in totals.items():
        key = named.get(key_id) if key_id is not None else None
        if key_id is not None and key is None:
            continue  # not the user's key (rows of one user hold only their own keys)
        rows.append(
            KeyUsageRow(key_id=key_id, label=key_label(key.name, key.pk) if key else CHAT_PAGES,
                        owner=key.owner.get_username() if key else "", state=key.state(now) if key else "",
                        turns=int(turns), prompt_tokens=int(prompt), output_tokens=int(output),
                        busy_s=round(busy, 3))
        )  # fmt: skip
    return sorted(rows, key=lambda r: (-r.output_tokens, r.key_id is not None, r.label, r.key_id or 0))


def _add(total: list[float], sums: Iterable[float]) -> None:
    for i, value in enumerate(sums):
        total[i] += value
