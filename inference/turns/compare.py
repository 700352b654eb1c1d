"""Compare: one message sent to two models (on one rig or two) at once, as two new chats shown side by side."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction

from inference.errors import InvalidInput
from inference.models import ChatSession, Rig
from inference.turns import selectors, sessions
from inference.turns.submit import turn_submit


def pick_parse(raw: object) -> tuple[int, str]:
    """A side's choice from the form, ``"<rig id>:<model name>"``."""
    rig_id, sep, model = raw.partition(":") if isinstance(raw, str) else ("", "", "")
    if not sep or not rig_id.isdigit() or not model:
        raise InvalidInput("bad_pick", "Choose a model for each side.")
    return int(rig_id), model


def compare_start(*, owner: User, picks: list[object], text: object) -> tuple[ChatSession, ChatSession]:
    """Two chats, one per pick, each sent ``text``. Everything is checked first (the picks, the models each rig
    serves, the message); a refused submit stores neither chat."""
    if len(picks) != 2:
        raise InvalidInput("bad_pick", "Choose a model for each side.")
    parsed = [pick_parse(pick) for pick in picks]
    rigs = {rig.pk: rig for rig in selectors.rig_list_enabled().filter(pk__in=[rig_id for rig_id, _ in parsed])}
    sides: list[tuple[Rig, str]] = []
    for rig_id, model in parsed:
        if rig_id not in rigs:
            raise InvalidInput("bad_pick", "That rig does not exist or is disabled.")
        sides.append((rigs[rig_id], model))
    with transaction.atomic():
        chats = [sessions.session_create(owner=owner, rig=rig, model_name=model) for rig, model in sides]
        for chat in chats:
            turn_submit(session=chat, text=text)
    return chats[0], chats[1]
