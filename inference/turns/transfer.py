"""Export a chat as Markdown or JSON, and import the JSON as a new chat of the importing user.

The JSON export is the import format: ``{"format": "rigdash.chat", "version": 1, "title", "rig", "model",
"settings", "turns": [{"user", "reply", "status", "finish_reason", "created_at"}]}``. An import is checked whole
before anything is written: a file that is not an export, a turn of the wrong shape, settings out of range or a
model no enabled rig serves is refused with a message, and nothing is stored.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from inference.backends.base import BackendError
from inference.errors import InvalidInput
from inference.models import ChatSession, Rig, Turn
from inference.turns import params as chat_settings
from inference.turns import selectors, sessions
from inference.turns.chats import TITLE_MAX_CHARS, title_validate

EXPORT_FORMAT = "rigdash.chat"
EXPORT_VERSION = 1
IMPORT_MAX_BYTES = 5 * 1024 * 1024
IMPORT_MAX_TURNS = 1000
REPLY_MAX_CHARS = 200_000
ENDED = {Turn.Status.DONE, Turn.Status.CANCELLED, Turn.Status.FAILED, Turn.Status.INTERRUPTED}


def session_export(session: ChatSession) -> dict[str, Any]:
    """The chat as the JSON export (finished turns; one still running is exported as far as it is stored)."""
    turns = session.turns.order_by("created_at", "id")
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "title": str(session),
        "rig": session.rig.name,
        "model": session.model_name,
        "settings": session.settings or {},
        "created_at": session.created_at.isoformat(),
        "turns": [
            {
                "user": turn.user_text,
                "reply": turn.reply_text,
                "status": turn.status if turn.status in ENDED else Turn.Status.INTERRUPTED,
                "finish_reason": turn.finish_reason,
                "created_at": turn.created_at.isoformat(),
            }
            for turn in turns
        ],
    }


def session_markdown(session: ChatSession) -> str:
    """The chat as Markdown: a heading, its model and settings, then each message under its speaker."""
    data = session_export(session)
    lines = [f"# {data['title']}", "", f"*{data['model']} on {data['rig']}*", ""]
    values = data["settings"]
    lines += [f"Settings: {chat_settings.settings_summary(values)}", ""]
    if values.get("system"):
        lines += ["## System", "", values["system"], ""]
    for turn in data["turns"]:
        lines += ["## User", "", turn["user"], "", "## Assistant", "", turn["reply"] or "*(no reply)*", ""]
    return "\n".join(lines)


def _bad(message: str) -> InvalidInput:
    return InvalidInput("bad_import", message)


def _parse(raw: bytes) -> dict[str, Any]:
    if len(raw) > IMPORT_MAX_BYTES:
        raise _bad(f"The file is over {IMPORT_MAX_BYTES // (1024 * 1024)} MiB.")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _bad("The file is not JSON: import a chat exported from RigDash as JSON.") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise _bad("The file is not a RigDash chat export.")
    if data.get("version") != EXPORT_VERSION:
        raise _bad(f"The export is of version {data.get('version')!r}; this RigDash reads version {EXPORT_VERSION}.")
    return data


def _turns(raw: Any) -> list[tuple[Turn, datetime | None]]:
    """The export's turns, unsaved, each with when it was sent (None: not given)."""
    if not isinstance(raw, list) or not raw:
        raise _bad("The export has no turns.")
    if len(raw) > IMPORT_MAX_TURNS:
        raise _bad(f"The export has {len(raw)} turns; the limit is {IMPORT_MAX_TURNS}.")
    limit = settings.RIGDASH.max_message_chars
    turns: list[tuple[Turn, datetime | None]] = []
    for number, item in enumerate(raw, start=1):
        if not isinstance(item, dict) or not all(isinstance(item.get(key), str) for key in ("user", "reply")):
            raise _bad(f"Turn {number} is not a user message with a reply.")
        if not item["user"].strip() or len(item["user"]) > limit:
            raise _bad(f"Turn {number}'s message is empty or over {limit} characters.")
        if len(item["reply"]) > REPLY_MAX_CHARS:
            raise _bad(f"Turn {number}'s reply is over {REPLY_MAX_CHARS} characters.")
        status = item.get("status", Turn.Status.DONE)
        finish = item.get("finish_reason", "")
        if status not in ENDED or not isinstance(finish, str) or len(finish) > 32:
            raise _bad(f"Turn {number} has an unknown status or finish reason.")
        turns.append((Turn(user_text=item["user"], reply_text=item["reply"], status=status, finish_reason=finish),
                      _when(item.get("created_at"))))  # fmt: skip
    return turns


def _when(raw: Any) -> datetime | None:
    """An export's timestamp (ISO 8601 with its offset), or None (then: now)."""
    if not isinstance(raw, str):
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _rig_serving(model: Any, rig_name: Any) -> Rig:
    """The enabled rig that serves ``model``: the one named in the export first, then any other."""
    if not isinstance(model, str) or not model:
        raise _bad("The export names no model.")
    rigs = sorted(selectors.rig_list_enabled(), key=lambda rig: rig.name != rig_name)
    for rig in rigs:
        try:
            if sessions.rig_serves(rig, model):
                return rig
        except BackendError:
            continue
    raise _bad(f"No rig serves the model {model!r} now; it cannot be imported.")


def session_import(*, owner: AbstractBaseUser | AnonymousUser, raw: bytes) -> ChatSession:
    """A new chat of ``owner`` from a JSON export, checked whole first."""
    data = _parse(raw)
    title = title_validate(str(data.get("title") or "Imported chat")[:TITLE_MAX_CHARS])
    values = chat_settings.params_validate(data.get("settings") or {})
    turns = _turns(data.get("turns"))
    rig = _rig_serving(data.get("model"), data.get("rig"))
    with transaction.atomic():
        session = ChatSession.objects.create(
            owner_id=owner.pk or 0, rig=rig, model_name=data["model"], title=title, settings=values
        )
        for turn, _stamp in turns:
            turn.session = session
            turn.params = values
        Turn.objects.bulk_create([turn for turn, _stamp in turns])  # created_at: now (auto_now_add), then:
        dated = []
        for turn, stamp in turns:
            if stamp is not None:
                turn.created_at = stamp
                dated.append(turn)
        Turn.objects.bulk_update(dated, ["created_at"], batch_size=500)  # each turn's own time, where it had one
    return session
