"""Exactly-once turns: however often the task is delivered, the turn runs once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from inference.models import Turn
from inference.turns import lifecycle
from inference.worker import start as starts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.llama]


def _run(turn_id: int) -> str:
    try:
        return starts.turn_run(turn_id)
    finally:
        connection.close()


def test_task_delivered_twice_at_once_runs_the_turn_once(chat_session):
    # Stored directly (not through turn_submit) so no worker picks it up: the two deliveries are ours.
    turn = Turn.objects.create(session=chat_session, user_text="Say yes.", params={"temperature": 0, "max_tokens": 8})
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = sorted(pool.map(_run, [turn.pk, turn.pk]))
    assert results == ["not-claimed", "ran"]
    turn.refresh_from_db()
    assert turn.status == Turn.Status.DONE
    assert turn.reply_text
    assert starts.turn_run(turn.pk) == "not-claimed"  # a late redelivery after the end
    turn.refresh_from_db()
    assert turn.status == Turn.Status.DONE


def test_cancelled_queued_turn_is_never_run(chat_session):

    turn = Turn.objects.create(session=chat_session, user_text="Say yes.")
    lifecycle.turn_cancel(turn=turn)
    assert starts.turn_run(turn.pk) == "not-claimed"
    turn.refresh_from_db()
    assert (turn.status, turn.finish_reason, turn.reply_text) == (Turn.Status.CANCELLED, "cancelled", "")
