"""Admin actions: cancel anyone's turn, create and (de)activate users, change roles and quotas. Each is audited.

Views and the board consumer check ``is_staff`` before calling these; the functions re-check it too, so a
demoted admin's request that was already on its way changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from inference import events
from inference.audit import audit_record
from inference.errors import InvalidInput, NotFound
from inference.models import Quota, Turn
from inference.turns.lifecycle import turn_cancel, turns_cancel_for_user
from rigdash.access import ROLE_SUPERUSER, outranks, role_rank, staff_now


def require_staff(actor: AbstractBaseUser | AnonymousUser) -> User:
    """The actor as an active admin, read again from the database; InvalidInput("forbidden") otherwise."""
    fresh = staff_now(actor)
    if fresh is None:
        raise InvalidInput("forbidden", "Only an active admin may do this.")
    return fresh


def _require_outranks(admin: User, user: User) -> None:
    """Roles: superuser > staff > user; nobody changes someone at or above their own role (read fresh)."""
    target = User.objects.filter(pk=user.pk).first()
    if target is None:
        raise NotFound("user")
    if not outranks(admin, target):
        raise InvalidInput("forbidden", "You cannot change an account whose role is at or above your own.")


def _turn_id(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise NotFound("turn")
    try:
        return int(raw)
    except ValueError:
        raise NotFound("turn") from None


def admin_turn_cancel(*, actor: AbstractBaseUser | AnonymousUser, turn_id: Any) -> Turn:
    """Cancel any user's queued or running turn; a finished one is refused and nothing is recorded."""
    admin = require_staff(actor)
    turn = Turn.objects.select_related("session", "session__owner").filter(pk=_turn_id(turn_id)).first()
    if turn is None:
        raise NotFound("turn")
    before = turn.status
    turn = turn_cancel(turn=turn)  # raises InvalidInput("turn_finished") when it already ended
    audit_record(
        actor=admin,
        action="turn.cancel",
        target=f"turn:{turn.pk}",
        detail={"owner": turn.session.owner.get_username(), "session": turn.session_id, "status_before": before},
    )
    return turn


def _revoke(user: User) -> None:
    """Tell the user's open sockets to re-check their rights (after the change is committed)."""
    user_id = user.pk
    transaction.on_commit(lambda: events.user_revoked_sync(user_id=user_id))


def user_create(
    *,
    actor: AbstractBaseUser | AnonymousUser,
    username: str,
    password: str,
    is_staff: bool = False,
    groups: Iterable[Group] = (),
) -> User:
    admin = require_staff(actor)
    if is_staff and role_rank(admin) < ROLE_SUPERUSER:
        raise InvalidInput("forbidden", "Only a superuser may create admin accounts.")
    username = (username or "").strip()
    candidate = User(username=username, is_staff=is_staff)
    try:
        candidate.full_clean(exclude=["password"])
        validate_password(password, candidate)
    except ValidationError as exc:
        raise InvalidInput("bad_user", " ".join(exc.messages)) from None
    with transaction.atomic():
        user = User.objects.create_user(username=username, password=password, is_staff=is_staff)
        user.groups.set(list(groups))
        audit_record(
            actor=admin,
            action="user.create",
            target=f"user:{user.username}",
            detail={"is_staff": is_staff, "groups": sorted(g.name for g in user.groups.all())},
        )
    return user


def user_set_active(*, actor: AbstractBaseUser | AnonymousUser, user: User, active: bool) -> User:
    admin = require_staff(actor)
    if user.pk == admin.pk and not active:
        raise InvalidInput("self", "You cannot deactivate your own account.")
    _require_outranks(admin, user)
    with transaction.atomic():
        changed = User.objects.filter(pk=user.pk).exclude(is_active=active).update(is_active=active)
        if changed:
            audit_record(actor=admin, action="user.activate" if active else "user.deactivate", target=_t(user))
            if not active:
                turns_cancel_for_user(user_id=user.pk)
                _revoke(user)
    user.refresh_from_db()
    return user


def user_set_staff(*, actor: AbstractBaseUser | AnonymousUser, user: User, staff: bool) -> User:
    admin = require_staff(actor)
    if user.pk == admin.pk and not staff:
        raise InvalidInput("self", "You cannot remove your own admin role.")
    _require_outranks(admin, user)
    if staff and role_rank(admin) < ROLE_SUPERUSER:
        raise InvalidInput("forbidden", "Only a superuser may make someone an admin.")
    with transaction.atomic():
        changed = (
            User.objects.filter(pk=user.pk)
            .exclude(is_staff=staff)
            .update(is_staff=staff, **({} if staff else {"is_superuser": False}))
        )
        if changed:
            audit_record(actor=admin, action="user.promote" if staff else "user.demote", target=_t(user))
            if not staff:
                _revoke(user)
    user.refresh_from_db()
    return user


def user_set_groups(*, actor: AbstractBaseUser | AnonymousUser, user: User, groups: Iterable[Group]) -> User:
    admin = require_staff(actor)
    _require_outranks(admin, user)
    new = sorted(g.name for g in groups)
    old = sorted(user.groups.values_list("name", flat=True))
    if new != old:
        with transaction.atomic():
            user.groups.set(list(groups))
            audit_record(actor=admin, action="user.groups", target=_t(user), detail={"before": old, "after": new})
    return user


def _t(user: User) -> str:
    return f"user:{user.get_username()}"


def quota_values(quota: Quota) -> dict[str, int | None]:
    return {name: getattr(quota, name) for name in Quota.LIMIT_FIELDS}


def quota_save(*, actor: AbstractBaseUser | AnonymousUser, quota: Quota, before: dict[str, Any] | None) -> Quota:
    """Store a validated quota (``full_clean`` runs again here) and record what changed."""
    admin = require_staff(actor)
    try:
        quota.full_clean()
    except ValidationError as exc:
        raise InvalidInput("bad_quota", " ".join(exc.messages)) from None
    created = quota.pk is None
    with transaction.atomic():
        quota.save()
        after = quota_values(quota)
        audit_record(
            actor=admin,
            action="quota.create" if created else "quota.update",
            target=str(quota),
            detail={"before": before, "after": after},
        )
    return quota


def quota_delete(*, actor: AbstractBaseUser | AnonymousUser, quota: Quota) -> None:
    admin = require_staff(actor)
    with transaction.atomic():
        audit_record(actor=admin, action="quota.delete", target=str(quota), detail={"before": quota_values(quota)})
        quota.delete()
