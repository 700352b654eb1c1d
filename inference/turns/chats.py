"""Writes for managing a user's chats: rename, delete, settings and presets. Callers pass objects already looked
up through the user's own rows (inference/selectors.py), so ownership is checked before anything here runs."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction

from inference.backends import capabilities
from inference.errors import InvalidInput
from inference.live import progress
from inference.live import state as live
from inference.models import ChatPreset, ChatSession, Turn
from inference.queue import dispatch
from inference.turns import params as chat_settings

log = logging.getLogger(__name__)
TITLE_MAX_CHARS = 200


def title_validate(raw: Any) -> str:
    title = " ".join(raw.split()) if isinstance(raw, str) else ""
    if not title:
        raise InvalidInput("bad_title", "The title is empty.")
    if len(title) > TITLE_MAX_CHARS:
        raise InvalidInput("bad_title", f"The title has {len(title)} characters; the limit is {TITLE_MAX_CHARS}.")
    return title


def session_rename(*, session: ChatSession, title: Any) -> ChatSession:
    session.title = title_validate(title)
    session.save(update_fields=["title", "updated_at"])
    return session


def session_delete(*, session: ChatSession) -> int:
    """Delete a chat with its turns. A reply still running is told to stop (its worker closes the backend's
    stream and finds nothing left to store); the turns' live text in Redis goes now. Returns the turns deleted."""
    with transaction.atomic():
        turns = list(session.turns.values_list("pk", "status"))
        running = [pk for pk, status in turns if status in Turn.RUNNING]
        active = any(status in Turn.ACTIVE for _pk, status in turns)
        rig_id = session.rig_id
        session.delete()  # cascades to its turns: a waiting turn leaves the fair queue with its row
        turn_ids = [pk for pk, _status in turns]
        transaction.on_commit(lambda: _forget_live(turn_ids, running), robust=True)
        if active:  # its slots are free: the next waiting turns get them
            transaction.on_commit(lambda: dispatch.rig_dispatch(rig_id=rig_id), robust=True)
    return len(turns)


def _forget_live(turn_ids: list[int], running: list[int]) -> None:
    client = live.sync_client()
    with client.pipeline(transaction=False) as pipe:
        for pk in running:
            pipe.set(live.cancel_key(pk), "1", ex=live.ENDED_TTL_S)
        for pk in turn_ids:
            pipe.delete(live.live_key(pk), progress.progress_key(pk))
        pipe.execute()


def session_settings_save(*, session: ChatSession, values: Any) -> ChatSession:
    """Store a chat's settings (checked first; a refusal stores nothing). New turns use them."""
    clean = chat_settings.params_validate(values)
    chat_settings.rig_settings_check(clean, accepted=capabilities(session.rig.kind).request_settings)
    session.settings = clean
    session.save(update_fields=["settings", "updated_at"])
    return session


def preset_save(*, owner: AbstractBaseUser | AnonymousUser, name: Any, values: Any) -> ChatPreset:
    """Create or replace the owner's preset of that name."""
    clean_name = chat_settings.preset_name_validate(name)
    clean = chat_settings.params_validate(values)
    try:
        preset, _created = ChatPreset.objects.update_or_create(
            owner_id=owner.pk, name=clean_name, defaults={"settings": clean}
        )
    except IntegrityError:  # two saves of the same new name at once: the other one won
        preset = ChatPreset.objects.get(owner_id=owner.pk, name=clean_name)
    return preset


def preset_apply(*, session: ChatSession, preset: ChatPreset) -> ChatSession:
    accepted = capabilities(session.rig.kind).request_settings
    return session_settings_save(session=session, values=chat_settings.rig_settings(preset.settings, accepted=accepted))


def preset_delete(*, preset: ChatPreset) -> None:
    preset.delete()
