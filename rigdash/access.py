"""Who may do what: the one staff check, for views, consumers and services alike.

``is_staff`` reads the user as the request or socket has it; ``staff_now`` and ``active_now`` ask the database, for
actions and sockets that must see a demotion or a deactivation made a moment ago.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def is_staff(user: Any) -> bool:
    """A logged-in, active admin, as the request or the socket's scope knows them."""
    return bool(user is not None and user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


def staff_now(user: Any) -> User | None:
    """The user as an active admin, read again from the database; None when they are not one (any more)."""
    if user is None or not user.is_authenticated:
        return None
    found: User | None = get_user_model().objects.filter(pk=user.pk, is_active=True, is_staff=True).first()
    return found


def staff_id_now(user_id: int) -> bool:
    return bool(get_user_model().objects.filter(pk=user_id, is_active=True, is_staff=True).exists())


def active_now(user_id: int) -> bool:
    return bool(get_user_model().objects.filter(pk=user_id, is_active=True).exists())


# Roles, highest first: superuser > staff > user. Nobody changes the role or active state of someone at or above
# their own role (their own account aside, where the views say so), and the last active superuser stays.
ROLE_USER, ROLE_STAFF, ROLE_SUPERUSER = 0, 1, 2


def role_rank(user: Any) -> int:
    if getattr(user, "is_superuser", False):
        return ROLE_SUPERUSER
    return ROLE_STAFF if getattr(user, "is_staff", False) else ROLE_USER


def outranks(actor: Any, target: Any) -> bool:
    """``actor`` may change ``target``'s role, active state or groups: a strictly higher role."""
    return role_rank(actor) > role_rank(target)


def may_act_on(actor: Any, target: Any, *, own: bool = False) -> bool:
    """``actor`` may act on ``target``'s account or what is theirs (role, active state, groups, quota, sessions, API
    keys, turns): only from a strictly higher role; on their own account too where ``own`` (their own turn or key).
    The one rule every board action goes through (``inference.board.actions.require_may_act_on``)."""
    if own and actor is not None and target is not None and actor.pk == target.pk:
        return True
    return outranks(actor, target)


def other_active_superusers(user_id: int) -> bool:
    """An active superuser other than ``user_id`` exists (so ``user_id`` may stop being one)."""
    return bool(get_user_model().objects.filter(is_active=True, is_superuser=True).exclude(pk=user_id).exists())


@dataclass(frozen=True)
class Rights:
    """What an open socket's user may still do, read from the database."""

    active: bool
    staff: bool
    session_ok: bool  # the socket's session still exists, is this user's, and matches their password


def rights_now(user_id: int, session_key: str | None) -> Rights:
    """The user's rights now and whether the session ``session_key`` still logs them in: it has not been logged
    out or expired, and the password has not changed since (Django's session auth hash)."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None:
        return Rights(active=False, staff=False, session_ok=False)
    return Rights(active=user.is_active, staff=user.is_staff, session_ok=_session_matches(session_key, user))


def _session_matches(session_key: str | None, user: Any) -> bool:
    if not session_key:
        return False
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    stored = data.get(HASH_SESSION_KEY)
    return bool(stored) and constant_time_compare(stored, user.get_session_auth_hash())
