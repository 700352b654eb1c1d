"""The domain errors every layer raises and every entry point turns into a status, an error frame or a close code.

Services never raise HTTP errors: views map these to 400/404/409/503 (inference/views/http.py), consumers to
``error`` frames and close codes (rigdash/ws.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


class InvalidInput(Exception):
    """Bad input from a user, with a message to show them and a machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotFound(InvalidInput):
    """The object does not exist, or is not the caller's: both look the same from outside."""

    def __init__(self, what: str) -> None:
        super().__init__("not_found", f"No such {what}.")


class QuotaExceeded(InvalidInput):
    """A turn refused (or stopped) by a quota: ``limit`` names it, ``resets_at`` says when it frees up."""

    def __init__(self, limit: str, message: str, resets_at: datetime | None = None) -> None:
        super().__init__(f"quota_{limit.removeprefix('max_')}", message)
        self.limit = limit
        self.resets_at = resets_at


class QueueUnavailable(Exception):
    """A turn's Celery task could not be sent (the broker is down). The turn is stored and waits again: the next
    dispatch (after a turn ends, or beat's ``inference.dispatch_all`` every few seconds) hands it out."""

    code = "queue_unavailable"
    message = (
        "Your message is saved, but the task queue cannot be reached right now. "
        "The reply starts once the queue is back; there is no need to send it again."
    )

    def __init__(self, turn_ids: Sequence[int]) -> None:
        super().__init__(f"the task of turns {list(turn_ids)} could not be sent; they wait to be handed out again")
