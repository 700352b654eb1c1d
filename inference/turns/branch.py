"""Regenerate a reply, or edit a message and send it again, as a branch: a new chat holding the conversation up to
that turn, which then answers it again. The original chat keeps its version, and each chat links to the other
(``ChatSession.branch_of`` and ``branch_of_turn``), so both versions stay one click apart."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from inference.errors import InvalidInput
from inference.models import ChatSession, Turn
from inference.turns.submit import turn_submit

COPIED_FIELDS = ("user_text", "reply_text", "params", "status", "finish_reason", "error", "stats", "rig")


def turn_branch(*, turn: Turn, text: Any = None, continue_reply: bool = False) -> ChatSession:
    """A new chat of the same owner, model and settings with copies of the turns before ``turn``, then ``text``
    (``turn``'s own message when None: a regenerate) submitted in it; ``continue_reply``: ``turn``'s message again,
    its reply so far sent as the reply's start for the backend to continue. All or nothing: a refused submit (an
    empty message, a quota) leaves no branch behind. The copies carry no token counts (usage counts each reply
    once)."""
    session = turn.session
    if turn.is_active:
        raise InvalidInput("turn_in_progress", "Wait for this reply to finish (or stop it) first.")
    params: dict[str, Any] = {}
    if continue_reply:
        if not turn.reply_text:
            raise InvalidInput("nothing_to_continue", "This turn has no reply to continue.")
        text, params = None, {"prefill": turn.reply_text}
    message = turn.user_text if text is None else text
    earlier = []
    for item in session.turns.order_by("created_at", "id"):
        if item.pk == turn.pk:
            break
        earlier.append(item)
    if any(item.is_active for item in earlier):
        raise InvalidInput("turn_in_progress", "Wait for the current reply to finish (or stop it) first.")
    versions = session.branches.filter(branch_of_turn=turn).count() + 2
    with transaction.atomic():
        branch = ChatSession.objects.create(
            owner_id=session.owner_id,
            rig_id=session.rig_id,
            placement=session.placement,
            model_name=session.model_name,
            title=f"{session}"[:180] + (" (continued)" if continue_reply else f" (version {versions})"),
            settings=session.settings,
            branch_of=session,
            branch_of_turn=turn,
            branch_at=len(earlier),
        )
        copies = [Turn(session=branch, **{name: getattr(item, name) for name in COPIED_FIELDS}) for item in earlier]
        Turn.objects.bulk_create(copies)
        branch = ChatSession.objects.select_related("rig").get(pk=branch.pk)
        turn_submit(session=branch, text=message, params=params or None)
    return branch


def versions_for(session: ChatSession) -> dict[str, Any]:
    """What the chat page shows of branches: where this chat branched from (the chat, and the position of the turn
    it answers again) and, by turn id, the branches made from this chat's turns."""
    origin = None
    if session.branch_of is not None:
        origin = {"session": session.branch_of_id, "title": str(session.branch_of), "index": session.branch_at or 0}
    branches: dict[str, list[dict[str, Any]]] = {}
    for child in session.branches.order_by("created_at", "id"):
        if child.branch_of_turn_id is not None:
            branches.setdefault(str(child.branch_of_turn_id), []).append({"session": child.pk, "title": str(child)})
    return {"origin": origin, "branches": branches}
