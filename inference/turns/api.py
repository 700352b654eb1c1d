"""A request of the OpenAI-compatible API as a turn: a session of its own (marked with its key, holding the
request's earlier messages), then the chat's own submit, so quotas, the fair queue, the board and usage apply."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from inference.models import ApiKey, ChatSession, Rig, Turn
from inference.turns.submit import turn_submit

TITLE_CHARS = 60


def api_turn_submit(*, key: ApiKey, rig: Rig, model: str, history: list[dict[str, Any]], text: str,
                    params: dict[str, Any], placed: bool = False, client: str = "") -> Turn:  # fmt: skip
    """Store the request's session and turn and dispatch it; InvalidInput (QuotaExceeded...) stores nothing.
    ``placed``: the request named the model, not a rig: it runs on any enabled rig serving it. ``client``: the
    request's user agent; the turn keeps it and its key's name for the board (``params["client"]``)."""
    params = {**params, "client": {"key": key.name[:200], "agent": client[:200]}}
    how = ChatSession.Placement.MODEL if placed else ChatSession.Placement.RIG
    with transaction.atomic():
        session = ChatSession.objects.create(
            owner_id=key.owner_id, rig=rig, model_name=model, api_key=key, context_messages=history,
            title=f"API ({key.name}): {text.strip()[:TITLE_CHARS]}", placement=how,
        )  # fmt: skip
        return turn_submit(session=session, text=text, params=params, new_session=True)
