"""Who may do what: the one staff check, for views, consumers and services alike.

``is_staff`` reads the user as the request or socket has it; ``staff_now`` and ``active_now`` ask the database, for
actions and sockets that must see a demotion or a deactivation made a moment ago.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model

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
