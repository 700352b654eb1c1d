"""Admin actions: cancel anyone's turn, create and (de)activate users, change roles and quotas. Each is audited.

Views and the board consumer check ``is_staff`` before calling these; the functions re-check it too, so a
demoted admin's request that was already on its way changes nothing. Roles (superuser > staff > user): nobody acts
on an account at or above their own role (``require_may_act_on``, ``rigdash.access.may_act_on``); the refusal is
InvalidInput("forbidden"), a 403 in the views and an error frame on the board's socket.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from inference import events
from inference.audit import audit_record
from inference.errors import InvalidInput, NotFound
from inference.models import Quota, Turn
from inference.turns.lifecycle import turn_cancel, turns_cancel_for_user
from rigdash.access import ROLE_SUPERUSER, may_act_on, role_rank, staff_now


def require_staff(actor: AbstractBaseUser | AnonymousUser) -> User:
    """The actor as an active admin, read again from the database; InvalidInput("forbidden") otherwise."""
    fresh = staff_now(actor)
    if fresh is None:
        raise InvalidInput("forbidden", "Only an active admin may do this.")
    return fresh


FORBIDDEN_RANK = "You cannot act on an account whose role is at or above your own."


def require_may_act_on(admin: User, user_id: int, *, own: bool = False) -> None:
    """Roles: superuser > staff > user; nobody acts on someone at or above their own role (the target read fresh;
    ``own``: the admin's own account is allowed, for their own turn or key)."""
    target = User.objects.filter(pk=user_id).first()
    if target is None:
        raise NotFound("user")
    if not may_act_on(admin, target, own=own):
        raise InvalidInput("forbidden", FORBIDDEN_RANK)


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
    require_may_act_on(admin, turn.session.owner_id, own=True)
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
    require_may_act_on(admin, user.pk)
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
    require_may_act_on(admin, user.pk)
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
    require_may_act_on(admin, user.pk)
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
    return {name: getattr(quota, name) for name in (*Quota.LIMIT_FIELDS, *Quota.RATE_FIELDS)}


def _require_may_set_quota(admin: User, quota: Quota) -> None:
    """A quota binds its user, every member of its group, or everyone (the default). A user's: the admin must
    outrank them. A group's or the default: a superuser's (the top role, binding themselves is theirs to do), or
    staff's where it binds no admin at all (so the default quota, while admins exist, is a superuser's)."""
    if quota.user_id is not None:
        require_may_act_on(admin, quota.user_id)
        return
    if role_rank(admin) == ROLE_SUPERUSER:
        return
    bound = User.objects.filter(groups=quota.group_id) if quota.group_id is not None else User.objects.all()
    if bound.filter(Q(is_staff=True) | Q(is_superuser=True)).exists():
        raise InvalidInput("forbidden", FORBIDDEN_RANK + " This quota applies to such an account.")


def quota_save(*, actor: AbstractBaseUser | AnonymousUser, quota: Quota, before: dict[str, Any] | None) -> Quota:
    """Store a validated quota (``full_clean`` runs again here) and record what changed."""
    admin = require_staff(actor)
    stored = Quota.objects.filter(pk=quota.pk).first() if quota.pk is not None else None
    for bound in (stored, quota):  # whom it bound before the edit, and whom it will bind
        if bound is not None:
            _require_may_set_quota(admin, bound)
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
    _require_may_set_quota(admin, quota)
    with transaction.atomic():
        audit_record(actor=admin, action="quota.delete", target=str(quota), detail={"before": quota_values(quota)})
        quota.delete()
