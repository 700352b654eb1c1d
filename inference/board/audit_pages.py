"""The audit log a page at a time, newest first: keyset pagination on (created_at, id), so an old page costs what
the first does (an OFFSET would read every row before it)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from inference.models import AuditLog
from rigdash import numbers

PAGE_ROWS = 200


def audit_page(*, action: str, before: str) -> dict[str, Any]:
    """The entries (of actions starting with ``action``) older than the one with id ``before``, or the newest when it
    names none; ``older``: the id to ask for the next page with (None on the last page)."""
    entries = AuditLog.objects.all()  # newest first (Meta.ordering: -created_at, -id)
    if action:
        entries = entries.filter(action__startswith=action)
    try:
        before_id: int | None = numbers.optional_int(before, name="before", default=0, low=1, high=2**63 - 1) or None
    except numbers.BadNumber:
        before_id = None  # a link from no page of ours: the newest page
    start = AuditLog.objects.filter(pk=before_id).values("created_at", "pk").first() if before_id else None
    if start is not None:
        at = start["created_at"]
        entries = entries.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=start["pk"]))
    rows = list(entries[: PAGE_ROWS + 1])
    older = rows[PAGE_ROWS - 1].pk if len(rows) > PAGE_ROWS else None
    return {"entries": rows[:PAGE_ROWS], "older": older, "paged": start is not None}
