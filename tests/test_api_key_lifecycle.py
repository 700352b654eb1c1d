"""A key's expiry cancels its requests (the beat's pass, once), and a key's choice of what is stored of its requests:
chats in the chat list (the default), or nothing once the response is delivered (docs/openai.md, "Keys" and
"What is stored")."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import openai
import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from inference.board import apikeys
from inference.models import ApiKey, ChatSession, Rig, Turn
from inference.turns import api, search, selectors
from inference.turns.board_rows import board_row_for
from tests import test_openai_gateway as gateway
from tests.conftest import wait_until
from tests.test_openai_gateway import FAKE_MODEL, TOOLS, _client, _ollama

fake_rig = gateway.fake_rig  # its fixture

pytestmark = pytest.mark.django_db(transaction=True)
HISTORY = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Secret: tulip."}]


@pytest.fixture
def idle_rig(db: Any) -> Rig:
    """A rig whose queue no worker consumes: a turn submitted to it stays waiting."""
    return Rig.objects.create(name="idle-rig", kind=Rig.Kind.OPENAI, base_url="http://127.0.0.1:9", queue="wt-idle")


def _submit(key: ApiKey, rig: Rig, text: str = "hi") -> Turn:
    return api.api_turn_submit(key=key, rig=rig, model="m", history=[], text=text, params={}, client="test/1")


def test_an_expired_keys_waiting_requests_are_cancelled_once(idle_rig, owner):
    expiring = apikeys.api_key_create(owner=owner, name="ci", expires_in_days=1).key
    lasting = apikeys.api_key_create(owner=owner, name="laptop", expires_in_days=30).key
    waiting, other = _submit(expiring, idle_rig), _submit(lasting, idle_rig)
    assert apikeys.api_keys_expired_cancel() == []  # nothing expired yet

    later = timezone.now() + timedelta(days=2)
    assert apikeys.api_keys_expired_cancel(now=later) == [expiring.pk]
    waiting.refresh_from_db()
    other.refresh_from_db()
    assert waiting.status == Turn.Status.CANCELLED and other.status == Turn.Status.QUEUED
    expiring.refresh_from_db()
    assert expiring.expiry_applied_at == later and expiring.state(later) == "expired"
    assert apikeys.api_keys_expired_cancel(now=later + timedelta(minutes=1)) == []  # once
    # The beat runs the pass.
    schedule = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"inference.api_keys_expire", "inference.api_texts_forget"} <= schedule


@pytest.mark.llama
def test_a_key_expiring_mid_reply_ends_the_clients_stream(web_url, celery_worker, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="agent", expires_in_days=1)
    client = _client(web_url, key.secret)
    story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    stream = client.chat.completions.create(model=model_name, max_tokens=700, messages=story, stream=True)
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen >= 3:
            break
    ApiKey.objects.filter(pk=key.key.pk).update(expires_at=timezone.now())
    assert apikeys.api_keys_expired_cancel() == [key.key.pk]
    with pytest.raises(openai.APIError, match="cancelled"):  # the stream's error event, then its end
        for _chunk in stream:
            pass
    assert Turn.objects.get().status == Turn.Status.CANCELLED
    with pytest.raises(openai.AuthenticationError, match="expired"):
        client.chat.completions.create(model=model_name, messages=story)


def _page_sessions(user: Any) -> list[int]:
    return [session.pk for session in selectors.session_page_for(user).sessions]


@pytest.mark.llama
def test_a_key_that_stores_nothing_answers_whole_and_keeps_only_counts(web_url, celery_worker, fake_rig, owner):
    key = apikeys.api_key_create(owner=owner, name="private", storage=ApiKey.Storage.NOTHING)
    client = _client(web_url, key.secret)
    asked = [*HISTORY, {"role": "user", "content": "What is the weather in Oslo?"}]
    whole = client.chat.completions.create(model=FAKE_MODEL, messages=asked, stop=["Celsius"])
    streamed = client.chat.completions.create(model=FAKE_MODEL, messages=asked, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    called = client.chat.completions.create(model=FAKE_MODEL, messages=asked, tools=TOOLS)
    ollama = _ollama(web_url, key.secret).chat(model=FAKE_MODEL, messages=asked)
    # Each response has its whole text: the texts go only once the view has them.
    assert whole.choices[0].message.content == text == ollama.message.content == "It is 12 C in Oslo."
    assert called.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'

    wait_until(
        lambda: Turn.objects.filter(params__forgotten=True).count() == 4,
        timeout_s=10,
        what="the streamed turn's texts wiped",
    )  # its view wipes them after the stream's last event
    turns = list(Turn.objects.select_related("session").order_by("pk"))
    assert len(turns) == 4 and all(t.status == Turn.Status.DONE for t in turns)
    for turn in turns:
        assert turn.user_text == turn.reply_text == turn.thinking_text == "" and turn.params["forgotten"] is True
        assert "message" not in turn.params and "passthrough" not in turn.params
        assert "tool_calls" not in turn.stats and "stop_sequence" not in turn.stats  # the reply's, as its text
        assert turn.session.hidden and turn.session.context_messages == [] and "Oslo" not in turn.session.title
        assert (turn.output_tokens or 0) > 0  # the counts stay
        row = board_row_for(turn.pk)  # the board row stays, naming the key and the client
        assert row["via_api"] and row["api_client"]["key"] == "private"
    assert apikeys.api_key_usage([key.key])[key.key.pk].turns == 4
    # Not in the chat list, its page or the search.
    assert _page_sessions(owner) == [] and search.session_search(owner, "Oslo") == []
    page = Client()
    page.force_login(owner)
    assert page.get(f"/sessions/{turns[0].session_id}/").status_code == 404
    assert '<option value="nothing" selected>' in page.get("/keys/").content.decode()


@pytest.mark.llama
def test_a_key_that_stores_chats_keeps_them_in_the_chat_list(web_url, celery_worker, fake_rig, owner):
    key = apikeys.api_key_create(owner=owner, name="editor")  # the default: chats
    assert key.key.storage == ApiKey.Storage.CHATS
    asked = [*HISTORY, {"role": "user", "content": "What is the weather in Oslo?"}]
    answer = _client(web_url, key.secret).chat.completions.create(model=FAKE_MODEL, messages=asked)
    assert answer.choices[0].message.content == "It is 12 C in Oslo."
    turn = Turn.objects.select_related("session").get()
    assert turn.user_text == "What is the weather in Oslo?" and turn.reply_text == "It is 12 C in Oslo."
    assert turn.session.context_messages == HISTORY and not turn.session.hidden
    assert _page_sessions(owner) == [turn.session_id]
    assert [hit.session.pk for hit in search.session_search(owner, "Oslo")] == [turn.session_id]
    assert api.api_texts_forget_ended(older_than_s=0) == []  # the pass leaves a storing key's turns alone


def test_the_pass_wipes_what_a_view_left_once_the_turn_has_ended(idle_rig, owner):
    """A client that went away before the end: its view wiped nothing; the periodic pass does, after its wait."""
    key = apikeys.api_key_create(owner=owner, name="gone", storage=ApiKey.Storage.NOTHING).key
    turn = api.api_turn_submit(key=key, rig=idle_rig, model="m", history=HISTORY, text="Secret: rose.",
                               params={"passthrough": {"suffix": "secret"}}, client="test/1")  # fmt: skip
    assert not api.api_turn_texts_forget(turn.pk)  # still waiting: left alone
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.CANCELLED, reply_text="Once upon",
                                           finished_at=timezone.now() - timedelta(minutes=20))  # fmt: skip
    assert api.api_texts_forget_ended(older_than_s=3600) == []  # ended too recently
    assert api.api_texts_forget_ended(older_than_s=900) == [turn.pk]
    turn.refresh_from_db()
    assert turn.user_text == turn.reply_text == "" and "passthrough" not in turn.params
    assert ChatSession.objects.get(pk=turn.session_id).context_messages == []
    assert api.api_texts_forget_ended(older_than_s=900) == []  # once
    assert apikeys.api_key_create(owner=owner, name="x", storage="nothing").key.storage == "nothing"
    with pytest.raises(Exception, match="stored"):
        apikeys.api_key_create(owner=owner, name="y", storage="maybe")
    # The keys page's form takes the choice.
    page = Client()
    page.force_login(owner)
    assert page.post("/keys/", {"name": "z", "storage": "nothing"}).status_code == 201
    assert ApiKey.objects.get(name="z").storage == ApiKey.Storage.NOTHING


def test_the_owner_changes_what_a_key_stores_for_the_requests_after(idle_rig, owner, other_user, admin_user):
    """The keys page's choice, changed later: the requests after it follow it, those before keep theirs; only the
    owner may change it (staff included in 'anyone else'), on an active key, to a known choice."""
    key = apikeys.api_key_create(owner=owner, name="editor").key
    before = _submit(key, idle_rig, "kept as a chat")
    browser = Client()
    browser.force_login(owner)
    page = browser.post(f"/keys/{key.pk}/storage", {"storage": "nothing"})
    assert page.status_code == 302
    key.refresh_from_db()
    assert key.storage == ApiKey.Storage.NOTHING
    key_now = ApiKey.objects.get(pk=key.pk)
    after = _submit(key_now, idle_rig, "not to be kept")
    assert ChatSession.objects.get(pk=after.session_id).hidden
    assert not ChatSession.objects.get(pk=before.session_id).hidden  # the earlier chat stays as it was
    assert b'<option value="nothing" selected>' in browser.get("/keys/").content

    refused = browser.post(f"/keys/{key.pk}/storage", {"storage": "everything"})
    assert refused.status_code == 400 and b"kept as chats or not stored" in refused.content
    assert ApiKey.objects.get(pk=key.pk).storage == ApiKey.Storage.NOTHING  # nothing lost
    for someone in (other_user, admin_user):  # another user's key looks missing, to staff too
        stranger = Client()
        stranger.force_login(someone)
        assert stranger.post(f"/keys/{key.pk}/storage", {"storage": "chats"}).status_code == 404
    assert Client().post(f"/keys/{key.pk}/storage", {"storage": "chats"}).status_code == 302  # to the login page
    assert ApiKey.objects.get(pk=key.pk).storage == ApiKey.Storage.NOTHING

    apikeys.api_key_revoke(key_id=key.pk, actor=owner)
    gone = browser.post(f"/keys/{key.pk}/storage", {"storage": "chats"})
    assert gone.status_code == 400 and b"This key is revoked" in gone.content


def test_embeddings_requests_are_checked_and_limited_like_any_request(idle_rig, owner):
    """/v1/embeddings refuses a bad body before it stores anything (OpenAI's shape), and its turn counts in the key's
    requests per minute: the next one over the limit is refused at submit (no worker needed: the rig's queue has
    none, so the first waits)."""
    from inference.backends.base import ModelInfo
    from inference.errors import QuotaExceeded
    from inference.live import served
    from inference.models import Quota

    served.served_store(idle_rig.pk, [ModelInfo(name="m")])
    key = apikeys.api_key_create(owner=owner, name="rag")
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {key.secret}"}
    for body, status, said in (
        ({"model": "m", "input": []}, 400, "input must be a string or a non-empty array"),
        ({"model": "m"}, 400, "input must be"),
        ({"input": "hi"}, 400, "model must be a non-empty string"),
        ({"model": "nope", "input": "hi"}, 404, "does not exist"),
    ):
        answer = Client().post("/v1/embeddings", body, content_type="application/json", **bearer)
        assert answer.status_code == status and said in answer.json()["error"]["message"], answer.content
    assert (
        Client().post("/v1/embeddings", {"model": "m", "input": "hi"}, content_type="application/json").status_code
        == 401
    )
    assert not Turn.objects.exists()

    Quota.objects.create(key_requests_per_minute=1)
    first = api.api_embeddings_submit(key=key.key, rig=idle_rig, model="m", body={"model": "m", "input": ["a", "b"]})
    assert first.params["embeddings"] is True and first.params["passthrough"] == {"input": ["a", "b"]}
    assert first.session.hidden and first.user_text == "embeddings of 2 input(s)"
    with pytest.raises(QuotaExceeded):
        api.api_embeddings_submit(key=key.key, rig=idle_rig, model="m", body={"model": "m", "input": "c"})
    assert Turn.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_stop_ends_an_embeddings_request_its_backend_has_not_answered(owner, silent_server):
    """The rig accepts the request and never answers (a backend stuck under load): Stop on the board ends the turn
    as cancelled within a poll of its flag, not after the first-token timeout; the worker is the test calling it."""
    import threading

    from inference.turns import lifecycle
    from inference.worker import start as starts

    rig = Rig.objects.create(name="stuck", kind=Rig.Kind.LLAMACPP, base_url=silent_server, queue="wt-stuck")
    key = apikeys.api_key_create(owner=owner, name="embedder").key
    turn = api.api_embeddings_submit(key=key, rig=rig, model="m", body={"model": "m", "input": ["hello"]})
    ran: list[dict[int, str]] = []
    worker = threading.Thread(target=lambda: ran.append(starts.turns_run([turn.pk])), daemon=True)
    worker.start()
    wait_until(lambda: Turn.objects.get(pk=turn.pk).status in Turn.RUNNING, timeout_s=10, what="the claim")
    time.sleep(0.5)  # the request waits on the rig
    stopped_at = time.monotonic()
    lifecycle.turn_cancel(turn=Turn.objects.select_related("session").get(pk=turn.pk))
    worker.join(timeout=10)
    assert not worker.is_alive() and ran == [{turn.pk: "ran"}]
    assert time.monotonic() - stopped_at < 2.0
    ended = Turn.objects.get(pk=turn.pk)
    assert (ended.status, ended.finish_reason) == (Turn.Status.CANCELLED, "cancelled")


@pytest.mark.django_db(transaction=True)
def test_ollamas_ps_lists_what_the_sampler_last_saw_loaded_without_asking_a_hung_server(owner, silent_server):
    """A router whose sampler kept its lists (the models it has, the one it holds): /api/ps answers from them at once,
    where asking the server itself would wait for its timeout."""
    from inference.backends.base import ModelInfo
    from inference.live import served

    rig = Rig.objects.create(name="router", kind=Rig.Kind.LLAMACPP, base_url=silent_server, queue="wt-router")
    served.served_store(rig.pk, [ModelInfo(name="big"), ModelInfo(name="small")])
    served.loaded_store(rig.pk, ["small"])
    key = apikeys.api_key_create(owner=owner, name="ollama-client")
    began = time.monotonic()
    answer = Client().get("/api/ps", HTTP_AUTHORIZATION=f"Bearer {key.secret}")
    assert answer.status_code == 200
    assert [m["name"] for m in answer.json()["models"]] == ["small"]
    assert time.monotonic() - began < 1.0
    served.loaded_store(rig.pk, [])  # asleep, as its sampler saw it: it holds nothing
    assert Client().get("/api/ps", HTTP_AUTHORIZATION=f"Bearer {key.secret}").json()["models"] == []
