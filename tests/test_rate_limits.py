"""Rate limits (requests and reply tokens per sliding minute, per user and per API key) on real Redis: the window's
arithmetic, the quotas' merge, HTTP 429 with a right ``Retry-After`` on /v1/ (RigDash's web server, a real worker
and llama-server), the chat socket's error frame, the quotas page and /metrics."""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Group
from django.test import Client

from inference.board import apikeys
from inference.errors import QueueUnavailable
from inference.live import ratewindow
from inference.models import ChatSession, Quota, Turn
from inference.queue import ratelimits
from inference.turns import lifecycle
from inference.turns.submit import turn_submit
from monitoring import prometheus
from tests.conftest import session_cookie_for
from tests.wsclient import ChatSocket


def _key(kind: str = "r") -> str:
    return f"rigdash:ratelimit:test:{uuid.uuid4().hex}:{kind}"


def test_a_request_window_admits_its_limit_then_says_when_the_oldest_request_leaves():
    window = ratewindow.Window(_key(), "r", 2)
    assert ratewindow.admit([window], now_ms=1_000_000) == (None, 0)
    assert ratewindow.admit([window], now_ms=1_010_000) == (None, 0)
    assert ratewindow.admit([window], now_ms=1_030_000) == (window, 30_000)  # the first leaves at 1_060_000
    assert ratewindow.admit([window], now_ms=1_060_001) == (None, 0)  # it left; the refusal did not count
    assert ratewindow.window_usage(window.key, "r", now_ms=1_060_001) == 2


def test_a_token_window_refuses_once_the_minutes_tokens_reach_the_limit_until_enough_leave():
    key = _key("t")
    ratewindow.tokens_add([key], 30, now_ms=2_000_000)
    ratewindow.tokens_add([key], 30, now_ms=2_020_000)
    window = ratewindow.Window(key, "t", 50)
    # 60 tokens: under 50 once the first 30 leave, at 2_060_000.
    assert ratewindow.admit([window], now_ms=2_025_000) == (window, 35_000)
    assert ratewindow.admit([window], now_ms=2_060_001) == (None, 0)
    assert ratewindow.window_usage(key, "t", now_ms=2_060_001) == 30


def test_one_full_window_refuses_and_adds_to_none():
    free, full = ratewindow.Window(_key(), "r", 5), ratewindow.Window(_key(), "r", 1)
    ratewindow.admit([full], now_ms=3_000_000)
    assert ratewindow.admit([free, full], now_ms=3_001_000)[0] == full
    assert ratewindow.window_usage(free.key, "r", now_ms=3_001_000) == 0


@pytest.mark.django_db
def test_rate_limits_merge_as_quotas_do(owner):
    group = Group.objects.create(name="team")
    owner.groups.add(group)
    Quota.objects.create(requests_per_minute=5, tokens_per_minute=100)  # the default
    Quota.objects.create(group=group, requests_per_minute=20, key_requests_per_minute=4)
    Quota.objects.create(user=owner, tokens_per_minute=1000)
    limits = ratelimits.rate_limits_for(owner.pk)
    assert limits == ratelimits.RateLimits(requests_per_minute=20, tokens_per_minute=1000,
                                           key_requests_per_minute=4, key_tokens_per_minute=None)  # fmt: skip


def _finish(turn: Turn, tokens: int) -> None:
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DECODING)
    outcome = lifecycle.TurnOutcome(status=Turn.Status.DONE, reply_text="x", thinking_text="", finish_reason="stop",
                                    stats={"output_tokens": tokens}, error="")  # fmt: skip
    assert lifecycle.turn_finish(turn=turn, outcome=outcome)


@pytest.mark.django_db(transaction=True)
def test_reply_tokens_count_per_user_and_per_key_each_on_its_own(owner, rig, broker_down):
    """A finished turn's tokens count in its owner's window and its key's; a key's limit leaves the user's other key
    and their chats free. (The broker is mocked down: the turns are stored and wait, which is all this needs.)"""
    one, two = apikeys.api_key_create(owner=owner, name="one").key, apikeys.api_key_create(owner=owner, name="two").key
    Quota.objects.create(user=owner, key_tokens_per_minute=40, tokens_per_minute=100)
    s_one = ChatSession.objects.create(owner=owner, rig=rig, model_name="m", api_key=one)
    s_two = ChatSession.objects.create(owner=owner, rig=rig, model_name="m", api_key=two)
    s_chat = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    _finish(Turn.objects.create(session=s_one, rig=rig, user_text="a"), 45)
    with pytest.raises(ratelimits.RateLimited) as refused:
        ratelimits.rate_check_submit(session=s_one)
    assert refused.value.limit == "key_tokens_per_minute" and refused.value.kind == "tokens"
    assert 58 <= refused.value.retry_after_s <= 60
    ratelimits.rate_check_submit(session=s_two)  # the other key: free
    _finish(Turn.objects.create(session=s_chat, rig=rig, user_text="b"), 60)  # the user's 105 tokens now
    with pytest.raises(ratelimits.RateLimited) as user_refused:
        ratelimits.rate_check_submit(session=s_two)
    assert user_refused.value.limit == "tokens_per_minute"
    assert ratelimits.usage_now(user_id=owner.pk)["tokens"] == 105


# Over the real web server and worker ---------------------------------------------------------------------


def _ask(web_url: str, key: str, model: str, content: str = "Say hi.") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}
    return httpx.post(f"{web_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=120)  # fmt: skip


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_requests_after_the_limit_get_429_with_a_right_retry_after_per_key_and_per_user(
    web_url, celery_worker, rig, model_name, owner
):
    Quota.objects.create(user=owner, requests_per_minute=3, key_requests_per_minute=2)
    one = apikeys.api_key_create(owner=owner, name="one").secret
    two = apikeys.api_key_create(owner=owner, name="two").secret
    first_sent = time.time()
    assert _ask(web_url, one, model_name).status_code == 200
    assert _ask(web_url, one, model_name).status_code == 200
    before = time.time()
    refused = _ask(web_url, one, model_name)  # the key's third in a minute
    after = time.time()
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests" and "API key" in error["message"]
    # The key's first request leaves the window 60 s after it was admitted (between first_sent and the reply).
    retry_after = int(refused.headers["Retry-After"])
    assert math.floor(first_sent + 60 - after) <= retry_after <= math.ceil(first_sent + 60 - before) + 1, retry_after
    assert _ask(web_url, two, model_name).status_code == 200  # the other key: its own window; the user's third
    by_user = _ask(web_url, two, model_name)  # the user's fourth
    assert by_user.status_code == 429 and "through this API key" not in by_user.json()["error"]["message"]
    assert "Retry-After" in by_user.headers
    assert Turn.objects.filter(session__owner=owner).count() == 3  # a refused request stores nothing
    scrape = prometheus.render()
    assert 'rigdash_rate_limited_total{limit="requests_per_minute",scope="key"}' in scrape
    assert 'rigdash_rate_limited_total{limit="requests_per_minute",scope="user"}' in scrape


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_reply_over_the_minutes_tokens_makes_the_next_request_429_of_type_tokens(
    web_url, celery_worker, rig, model_name, owner, admin_user
):
    Quota.objects.create(user=owner, tokens_per_minute=5)
    key = apikeys.api_key_create(owner=owner, name="one").secret
    # A count runs to max_tokens (12) at temperature 0; "Say hi." may end within the 5.
    answered = _ask(web_url, key, model_name, content="Count from 1 to 20, separated by commas.")
    ended = time.time()
    assert answered.status_code == 200
    assert answered.json()["usage"]["completion_tokens"] > 5
    refused = _ask(web_url, key, model_name)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
    assert 55 <= int(refused.headers["Retry-After"]) <= math.ceil(ended + 60 - time.time()) + 1
    page = Client(HTTP_HOST="127.0.0.1")
    page.force_login(admin_user)
    html = page.get("/board/quotas/").content.decode()
    assert "reply tokens per minute" in html and "tokens_per_minute" in html  # the column and the refusal
    used = ratelimits.usage_now(user_id=owner.pk)
    assert f"{used['requests']} requests, {used['tokens']} tokens" in html


@pytest.mark.django_db(transaction=True)
async def test_the_chat_socket_answers_a_rate_limited_send_with_an_error_frame_saying_when(owner, rig, broker_down):
    from channels.db import database_sync_to_async

    def setup() -> tuple[int, str]:
        Quota.objects.create(user=owner, requests_per_minute=1)
        first = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
        with contextlib.suppress(QueueUnavailable):  # stored and counted; its task waits for the broker
            turn_submit(session=first, text="one")
        return ChatSession.objects.create(owner=owner, rig=rig, model_name="m").pk, session_cookie_for(owner)

    session_id, cookie = await database_sync_to_async(setup)()
    socket = ChatSocket(session_id, cookie)
    assert (await socket.connect())[0]
    try:
        await socket.send({"type": "turn.send", "text": "two", "client_id": "c1"})
        frame: Any = await socket.recv_until(lambda f: f.get("type") == "error")
    finally:
        await socket.close()
    assert frame["code"] == "quota_requests_per_minute" and frame["request"] == "c1"
    assert 58 <= frame["retry_after_s"] <= 60 and "Try again in" in frame["message"]
