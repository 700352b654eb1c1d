"""``POST /v1/chat/completions`` with the official ``openai`` client against RigDash (uvicorn, a Celery worker) in front
of the real llama-server: a request is a turn (quotas, queue, usage), answered whole or streamed, and a client that
disconnects cancels it."""

from __future__ import annotations

import httpx
import openai
import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from inference.board import apikeys
from inference.models import ChatSession, Quota, Turn
from inference.turns.board_rows import board_row_for
from tests.conftest import llama_busy_slots, wait_until

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
SYSTEM = "You are a terse assistant. " * 12


def _client(web_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=120)


def _only_turn() -> Turn:
    return Turn.objects.select_related("session").get()


def test_a_completion_is_a_turn_with_the_requests_messages(web_url, celery_worker, rig, model_name, owner, other_user):
    key = apikeys.api_key_create(owner=owner, name="editor")
    answer = _client(web_url, key.secret).chat.completions.create(
        model=model_name, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}],
    )  # fmt: skip
    turn = _only_turn()
    assert turn.status == Turn.Status.DONE and turn.session.owner == owner and turn.session.api_key_id == key.key.pk
    assert turn.session.context_messages == [{"role": "system", "content": SYSTEM}]
    assert turn.user_text == "Name a colour." and turn.session.title.startswith("API (editor)")
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == turn.reply_text != ""
    assert choice.finish_reason in ("stop", "length") and answer.model == model_name
    assert answer.usage.completion_tokens == turn.output_tokens > 0
    assert answer.usage.prompt_tokens == turn.prompt_tokens > 60  # the system message reached the model
    assert board_row_for(turn.pk)["via_api"] is True  # the admin board marks it
    assert not Session.objects.exists()  # an API request never makes a Django session (nor sets a cookie, below)
    # The other user sees nothing of it.
    other = Client()
    other.force_login(other_user)
    assert other.get(f"/api/turns/{turn.pk}").status_code == 404
    assert other.get(f"/sessions/{turn.session_id}/").status_code == 404


def test_streaming_with_usage_equals_the_stored_reply(web_url, celery_worker, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="agent")
    chunks = list(
        _client(web_url, key.secret).chat.completions.create(
            model=model_name, max_tokens=40, temperature=0, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Count from 1 to 10."}],
        )
    )  # fmt: skip
    turn = _only_turn()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == turn.reply_text != ""
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [turn.finish_reason if turn.finish_reason == "length" else "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == turn.output_tokens


def test_a_client_that_disconnects_cancels_the_turn(web_url, celery_worker, rig, model_name, owner, llama_url):
    key = apikeys.api_key_create(owner=owner, name="script")
    stream = _client(web_url, key.secret).chat.completions.create(
        model=model_name, max_tokens=700, temperature=0.8, seed=3, stream=True,
        messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
    )  # fmt: skip
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen >= 5:
            break
    stream.close()
    wait_until(lambda: _only_turn().status == Turn.Status.CANCELLED, timeout_s=30, what="the turn to be cancelled")
    wait_until(lambda: llama_busy_slots(llama_url) == 0, timeout_s=30, what="llama-server to free the slot")
    assert (_only_turn().output_tokens or len(_only_turn().reply_text)) > 0 and _only_turn().reply_text


def test_quota_errors_and_bad_requests_in_openais_shape(web_url, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="sdk")
    client = _client(web_url, key.secret)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:  # a turn is one reply
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], n=2)
    assert bad.value.body["param"] == "n" and bad.value.body["code"] == "unsupported_value"
    headers = {"Authorization": f"Bearer {key.secret}", "Content-Type": "application/json"}
    hostile = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    for body in (hostile % model_name.encode(), b'{"model": "m", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        refused = httpx.post(f"{web_url}/v1/chat/completions", headers=headers, content=body)
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    Quota.objects.create(user=owner, max_output_tokens_per_day=5)
    spent = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
    Turn.objects.create(session=spent, user_text="x", status="done", output_tokens=5, started_at=timezone.now(),
                        finished_at=timezone.now())  # fmt: skip
    response = httpx.post(f"{web_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key.secret}"},
                          json={"model": model_name, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "set-cookie" not in response.headers
    assert 0 < int(response.headers["Retry-After"]) <= 86400
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}])
    assert Turn.objects.count() == 1 and ChatSession.objects.count() == 1  # refused: nothing stored
    refused = httpx.post(f"{web_url}/v1/chat/completions", headers={"Authorization": "Bearer nope"}, json={})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
