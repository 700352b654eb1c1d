"""Model signals that tell running processes about a change made anywhere (Django admin, shell, our own pages).

A user saved (deactivated, demoted, a new password) or logged out: their sockets re-check their rights and session;
a deactivated user's waiting and running turns are cancelled. A rig saved or deleted: the sampler reads its list of
rigs again, and the running workers start or stop consuming its queue.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from inference import events
from inference.models import Rig
from inference.turns.lifecycle import turns_cancel_for_user
from inference.worker import queues


def user_saved(sender: type[User], instance: User, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created:
        return
    if update_fields and set(update_fields) <= {"last_login"}:  # every login saves this; nothing changed
        return
    user_id = instance.pk
    if not instance.is_active:
        turns_cancel_for_user(user_id=user_id)
    # Their sockets re-check is_active, is_staff and their session in the database: after the change is committed.
    transaction.on_commit(lambda: events.user_revoked_sync(user_id=user_id), robust=True)


def user_logged_out(sender: Any, request: Any, user: User | None, **kwargs: Any) -> None:
    if user is None:
        return
    user_id = user.pk
    # Django flushes the session after this signal: the sockets' periodic re-check (every few seconds) finds it gone.
    transaction.on_commit(lambda: events.user_revoked_sync(user_id=user_id), robust=True)


def rig_changed(sender: type[Rig], instance: Rig, **kwargs: Any) -> None:
    # robust: the rig is saved whatever Redis does; the sampler's periodic refresh then finds the change.
    transaction.on_commit(events.rigs_changed_sync, robust=True)
    if kwargs.get("update_fields") and set(kwargs["update_fields"]) <= {"models_served"}:
        return
    # The running workers start (or stop) consuming its queue (inference/worker/queues.py); the beat's periodic
    # pass catches a message lost with the broker.
    transaction.on_commit(queues.reconcile_soon, robust=True)
