"""Start tickets: what a worker needs to send a turn's backend request before it reads the database.

A turn stored and dispatched in one submit's transaction starts milliseconds later, and everything its backend
request needs was in the submit's hands: the session's model, the conversation (one turn at a time per session,
so nothing can change it between the submit and the start), the turn's parameters and its owner's limits. The
submit puts these in the Celery message as a ticket; the worker sends the request at once and claims the turn
beside it, while the backend reads the prompt. The claim is still the conditional UPDATE that makes a turn run
once: a turn cancelled, or claimed by another delivery, in between has its request closed before anything of it
is published. So the worker's reads and claim are off the turn's time to first token.

Not ticketed, and started from a fresh read: turns that waited for a slot (a later dispatch hands them
out), and turns whose owner has a daily allowance (each start reserves from it under the owner's row lock). Where
the request goes is never in the ticket: the worker takes the rig's backend from the database
(inference/worker/start.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.models import Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartTicket:
    turn_id: int
    rig_id: int
    model: str
    messages: list[dict[str, Any]]  # the conversation up to and including the turn's user message
    params: dict[str, Any]  # the turn's validated parameters (temperature, top_p, seed, max_tokens)
    max_tokens: int  # the reply's token cap, reserved on the turn by its claim
    context_limit: int | None  # the owner's context limit, checked against the backend's prompt count
    early: str = ""  # the early ticket the web process sent for this turn, if any (inference/queue/early.py)

    def as_message(self) -> dict[str, Any]:
        return asdict(self)


def ticket_from_message(raw: Any) -> StartTicket | None:
    """The ticket in a Celery message, or None when it is not one (the turn then starts from a fresh read)."""
    try:
        ticket = StartTicket(**raw)
        valid = (
            all(_is_int(v) for v in (ticket.turn_id, ticket.rig_id, ticket.max_tokens))
            and isinstance(ticket.model, str)
            and isinstance(ticket.params, dict)
            and ticket.max_tokens > 0
            and (ticket.context_limit is None or _is_int(ticket.context_limit))
            and isinstance(ticket.early, str)
            and isinstance(ticket.messages, list)
            and all(_is_message(m) for m in ticket.messages)
            and bool(ticket.messages)
        )
    except TypeError:
        valid = False
    if not valid:
        # Not its text: a ticket holds a conversation, which has no place in a log.
        turn = raw.get("turn_id") if isinstance(raw, Mapping) else None
        log.warning("a start ticket that is not one was ignored (a %s, turn %.20r)", type(raw).__name__, turn)
        return None
    return ticket


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is not a count


def _is_message(message: Any) -> bool:
    """A chat message: a role and text, or an API client's message (content parts; an assistant's tool calls with
    no content; a tool's ``tool_call_id``)."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        return False
    content = message.get("content")
    return isinstance(content, str | list) or (content is None and bool(message.get("tool_calls")))


def ticket_agrees(ticket: StartTicket, turn: Turn) -> bool:
    """The claim's read of the turn (with its session) says what the ticket says; the earlier conversation is not
    read again, and the rig's address never came from the ticket."""
    return (
        turn.pk == ticket.turn_id
        and turn.session.rig_id == ticket.rig_id
        and turn.session.model_name == ticket.model
        and ticket.messages[-1] == turn.prompt_message()
        and (turn.params or {}) == ticket.params
    )


def tickets_by_turn(raw: Any, turn_ids: list[int]) -> dict[int, StartTicket]:
    """The valid tickets of a task's message for the turns it names."""
    if not isinstance(raw, list):
        return {}
    tickets = (ticket_from_message(item) for item in raw)
    return {t.turn_id: t for t in tickets if t is not None and t.turn_id in turn_ids}
