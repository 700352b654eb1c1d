"""Model signals that tell running processes about a change made anywhere (Django admin, shell, our own pages).

A user saved without rights they may have had: their sockets re-check them. A rig saved or deleted: the sampler
reads its list of rigs again.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from inference import events
from inference.models import Rig


def user_saved(sender: type[User], instance: User, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (instance.is_active and instance.is_staff):
        return
    if update_fields and set(update_fields) <= {"last_login"}:  # every login saves this; nothing changed
        return
    user_id = instance.pk
    # Their sockets re-check is_active / is_staff in the database, so only after the change is committed.
    transaction.on_commit(lambda: events.user_revoked_sync(user_id=user_id))


def rig_changed(sender: type[Rig], instance: Rig, **kwargs: Any) -> None:
    # robust: the rig is saved whatever Redis does; the sampler's periodic refresh then finds the change.
    transaction.on_commit(events.rigs_changed_sync, robust=True)
