"""A user saved without rights they may have had (Django admin, shell, our users page): tell their sockets."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from inference import events


def user_saved(sender: type[User], instance: User, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (instance.is_active and instance.is_staff):
        return
    if update_fields and set(update_fields) <= {"last_login"}:  # every login saves this; nothing changed
        return
    user_id = instance.pk
    # Their sockets re-check is_active / is_staff in the database, so only after the change is committed.
    transaction.on_commit(lambda: events.user_revoked_sync(user_id=user_id))
