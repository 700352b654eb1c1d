"""Rigs as staff manage them in RigDash's own pages: create, edit, disable, delete, issue an agent key. Each is
audited; the agent key itself never goes in the log.

Where a rig points is a superuser's call: creating a rig, or changing its URL or kind, sends users' chats (prompts
and replies) to that address, so staff may edit a rig's other fields only (InvalidInput("forbidden") otherwise)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from inference.audit import audit_record
from inference.board.actions import require_staff
from inference.errors import InvalidInput
from inference.models import ChatSession, Rig, Turn

FIELDS = ("name", "kind", "base_url", "slots", "is_default", "enabled", "api_key")
# Where the rig's chats go, and the key that lets RigDash in there: a superuser's to set or change.
SUPERUSER_FIELDS = ("kind", "base_url", "api_key")
SECRET_FIELDS = ("api_key",)  # audited as set or cleared, never by value


def rig_save(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig) -> Rig:
    """Store a validated rig (inference/forms.py, RigForm) and record what changed."""
    admin = require_staff(actor)
    before = None if rig.pk is None else dict(Rig.objects.filter(pk=rig.pk).values(*FIELDS)[0])
    if not admin.is_superuser:
        if before is None:
            raise InvalidInput("forbidden", "Only a superuser may add a rig: it decides where chats are sent.")
        moved = [name for name in SUPERUSER_FIELDS if before[name] != getattr(rig, name)]
        if moved:
            raise InvalidInput(
                "forbidden",
                f"Only a superuser may change a rig's {' or '.join(moved)}: it decides where chats are sent.",
            )
    with transaction.atomic():
        rig.save()
        after = {name: getattr(rig, name) for name in FIELDS}
        changed = after if before is None else {k: v for k, v in after.items() if before.get(k) != v}
        for name in SECRET_FIELDS:
            if name in changed:
                changed[name] = "set" if changed[name] else "cleared"
        audit_record(
            actor=admin,
            action="rig.create" if before is None else "rig.update",
            target=f"rig:{rig.name}",
            detail=changed,
        )
    return rig


def rig_delete(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig) -> None:
    """Delete a rig nobody's chats use; refused (with what to do instead) while turns or chats use it."""
    admin = require_staff(actor)
    active = Turn.objects.filter(session__rig=rig, status__in=Turn.ACTIVE).count()
    if active:
        raise InvalidInput("rig_in_use", f"{active} turn(s) are waiting or running on {rig.name}: stop them first.")
    chats = (
        ChatSession.objects.filter(rig=rig).count() or Turn.objects.filter(rig=rig).values("session").distinct().count()
    )
    if chats:
        raise InvalidInput(
            "rig_has_chats", f"{chats} chat(s) were held on {rig.name}: disable it instead, so their history stays."
        )
    with transaction.atomic():
        audit_record(actor=admin, action="rig.delete", target=f"rig:{rig.name}", detail={"kind": rig.kind})
        rig.delete()


def rig_issue_agent_key(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig) -> str:
    """A new agent key for the rig (the old one's agent is refused from now on); shown once to the admin."""
    admin = require_staff(actor)
    key = secrets.token_urlsafe(32)
    with transaction.atomic():
        Rig.objects.filter(pk=rig.pk).update(agent_key=key)
        audit_record(actor=admin, action="rig.agent_key", target=f"rig:{rig.name}", detail={"rotated": True})
    return key


def rig_rows(rigs: list[Rig], agent_states: dict[int, Any]) -> list[dict[str, Any]]:
    """The rigs page's rows: each rig, its queue and its agent's state."""
    return [{"rig": rig, "agent": agent_states.get(rig.pk)} for rig in rigs]
