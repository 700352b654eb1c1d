"""The submit-time context check counts all the backend will read: the chat's system prompt and a turn's prefill,
besides the conversation, so an over-long prompt is refused before anything is queued."""

from __future__ import annotations

import pytest
from django.test import Client

from inference import errors
from inference.models import ChatSession, Quota, Rig, Turn
from inference.queue import quotas
from inference.turns import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(owner):
    rig = Rig.objects.create(name="quiet", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.nobody-listens")
    Quota.objects.create(user=owner, max_context_tokens=100)
    return ChatSession.objects.create(owner=owner, rig=rig, model_name="m")


def test_a_system_prompt_over_the_context_limit_is_refused_at_submit_and_nothing_is_queued(owner, session):
    session.settings = {"system": "You are a careful assistant. " * 60}  # about 435 tokens
    session.save(update_fields=["settings"])
    client = Client()
    client.force_login(owner)
    response = client.post(f"/api/sessions/{session.pk}/turns", {"text": "hi"}, content_type="application/json")
    assert 400 <= response.status_code < 500
    message = response.json()["error"]["message"]
    assert "system prompt alone" in message and "context limit is 100 tokens" in message
    assert not Turn.objects.exists()


def test_a_prefill_counts_in_the_submit_estimate(session):
    with pytest.raises(errors.QuotaExceeded, match="context limit is 100"):
        submit.turn_submit(session=session, text="hi", params={"prefill": "Once upon a time " * 40})
    assert not Turn.objects.exists()


def test_the_estimate_adds_the_system_prompt_and_the_prefill(session):
    bare = quotas.session_prompt_estimate(session, "hi")
    full = quotas.session_prompt_estimate(session, "hi", system="x" * 400, prefill="y" * 400)
    assert full == bare + (100 + 4) * 2  # each: its text (4 characters a token) and the template around it
