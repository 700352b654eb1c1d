"""The audit log of admin actions: one call per action, one row each; admins read it at /board/audit/."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from inference.models import AuditLog


def audit_record(
    *, actor: AbstractBaseUser | AnonymousUser | None, action: str, target: str, detail: dict[str, Any] | None = None
) -> AuditLog:
    """Store that ``actor`` did ``action`` (e.g. ``turn.cancel``, ``model.pull``) to ``target`` (e.g. ``turn:12``)."""
    authenticated = actor is not None and actor.is_authenticated
    return AuditLog.objects.create(
        actor_id=actor.pk if authenticated and actor is not None else None,
        actor_name=actor.get_username() if authenticated and actor is not None else "system",
        action=action[:64],
        target=target[:200],
        detail=detail or {},
    )


def audit_recent(*, limit: int = 200, action: str = "") -> QuerySet[AuditLog]:
    entries = AuditLog.objects.all()
    if action:
        entries = entries.filter(action__startswith=action)
    return entries[:limit]
