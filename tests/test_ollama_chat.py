"""A chat turn on an Ollama rig end to end: websocket -> real Celery worker -> Ollama plug-in -> websocket.

No Ollama binary can run here: the rig points at tests/ollama_replay.py, a protocol replay of Ollama's API
served from the test process; everything else (worker, Redis, PostgreSQL, Channels) is real.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from inference import errors
from inference.models import ChatSession, Rig, Turn
from inference.turns import sessions
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import WORDS, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.wsclient import ChatSocket, token_frames

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2:135m"


@pytest.fixture
def ollama_rig(db, ollama):
    # The test worker consumes TEST_QUEUE; these tests do not use the llama.cpp ``rig`` fixture that shares it.
    return Rig.objects.create(name="ollama-test", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)


@pytest.fixture
def ollama_session(owner, ollama_rig):
    return sessions.session_create(owner=owner, rig=ollama_rig, model_name=MODEL)


async def _turn(sock: ChatSocket, text: str, params: dict) -> int:
    await sock.send({"type": "turn.send", "text": text, "params": params})
    queued = await sock.recv_until(lambda f: f["type"] in ("turn.queued", "error"))
    assert queued["type"] == "turn.queued", queued
    return int(queued["turn"]["id"])


async def _open(session: ChatSession, user) -> ChatSocket:
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(user))
    assert (await sock.connect())[0]
    await sock.recv()  # session.snapshot
    return sock


def test_session_on_an_ollama_rig_checks_the_model_name(owner, ollama_rig):
    with pytest.raises(errors.InvalidInput) as info:
        sessions.session_create(owner=owner, rig=ollama_rig, model_name="no-such-model")
    assert info.value.code == "unknown_model"


async def test_ollama_turn_streams_and_stores_ollamas_counters(celery_worker, ollama_session, owner, ollama):
    ollama.reply_tokens = 40
    sock = await _open(ollama_session, owner)
    turn_id = await _turn(sock, "Tell me about the lighthouse.", {"temperature": 0, "max_tokens": 100, "seed": 3})
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    await sock.close()

    tokens = token_frames(sock.frames, turn_id)
    assert [f["seq_from"] for f in tokens] == [1] + [f["seq_to"] + 1 for f in tokens[:-1]]  # contiguous
    streamed = "".join(f["text"] for f in tokens)
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.DONE and turn.finish_reason == "stop"
    assert streamed == turn.reply_text == end["turn"]["reply"] == " ".join((WORDS * 3)[:40])
    sent = ollama.last_request("/api/chat")
    assert sent["model"] == MODEL and sent["options"] == {"num_predict": 100, "temperature": 0.0, "seed": 3}
    assert sent["messages"] == [{"role": "user", "content": "Tell me about the lighthouse."}]
    stats = turn.stats
    assert stats["output_events"] == 40 == stats["output_tokens"] == stats["backend_timings"]["eval_count"]
    assert stats["prompt_tokens"] == stats["backend_timings"]["prompt_eval_count"] > 0
    assert stats["prompt_ms"] == round(stats["backend_timings"]["prompt_eval_duration"] / 1e6, 3)
    assert stats["backend_decode_tps"] > 0 and stats["ttft_ms"] > 0


async def test_ollama_stream_cut_mid_reply_fails_the_turn_and_keeps_its_text(
    celery_worker, ollama_session, owner, ollama
):
    ollama.reply_tokens, ollama.cut_after_tokens = 40, 6
    sock = await _open(ollama_session, owner)
    turn_id = await _turn(sock, "Go on.", {"max_tokens": 100})
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    await sock.close()

    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.FAILED and turn.finish_reason == "backend_unavailable"
    streamed = "".join(f["text"] for f in token_frames(sock.frames, turn_id))
    assert turn.reply_text == streamed == end["turn"]["reply"] == " ".join(WORDS[:6])
    assert turn.error.startswith("Rig ollama-test: ") and "Ollama" in turn.stats["error_detail"]


async def test_stop_on_an_ollama_turn_closes_the_stream(celery_worker, ollama_session, owner, ollama):
    ollama.reply_tokens, ollama.token_interval_s = 1000, 0.01
    sock = await _open(ollama_session, owner)
    turn_id = await _turn(sock, "A long one, please.", {"max_tokens": 1000})
    await sock.recv_until(lambda f: f["type"] == "token" and f["turn"] == turn_id and f["seq_to"] >= 5)
    await sock.send({"type": "turn.cancel", "turn": turn_id})
    await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id, timeout=10)
    await sock.close()

    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.CANCELLED and 5 <= turn.stats["output_events"] < 1000
    closed = await sync_to_async(ollama.wait_closed_early)(timeout_s=5)
    assert closed is not None and closed["path"] == "/api/chat" and closed["tokens_sent"] < 1000


def test_raw_completions_through_rigdash_reach_an_ollama_rigs_generate(
    web_url, celery_worker, ollama_rig, owner, ollama
):
    """The official clients' raw completions on an Ollama rig, each a turn: openai's ``completions`` (streamed and
    whole) and ollama's ``generate(raw=True)`` reach the rig's /api/generate in raw mode; a code completion with a
    suffix on a model that cannot fill in the middle comes back as Ollama refused it."""
    import ollama as ollama_client
    import openai

    from inference.board import apikeys

    ollama.reply_tokens = 6
    secret = apikeys.api_key_create(owner=owner, name="completions").secret
    client = openai.OpenAI(base_url=f"{web_url}/v1", api_key=secret, max_retries=0, timeout=60)
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20)
    assert whole.choices[0].text == " ".join(WORDS[:6]) and whole.usage.completion_tokens == 6
    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, stream=True)
    assert "".join(part.choices[0].text for part in streamed) == " ".join(WORDS[:6])
    sent = ollama.last_request("/api/generate")
    assert sent["prompt"] == "Once upon a time" and sent["raw"] is True and sent["options"]["num_predict"] == 20

    by_ollama = ollama_client.Client(host=web_url, headers={"Authorization": f"Bearer {secret}"}, timeout=60)
    generated = by_ollama.generate(model=MODEL, prompt="A raw prompt", raw=True, options={"num_predict": 20})
    assert generated.response == " ".join(WORDS[:6]) and generated.done
    assert ollama.last_request("/api/generate")["prompt"] == "A raw prompt"

    with pytest.raises(openai.BadRequestError, match="does not support insert"):
        client.completions.create(model=MODEL, prompt="def f():\n    ", suffix="\n    return x", max_tokens=8)
    turns = Turn.objects.filter(session__api_key__isnull=False).order_by("id")
    assert [t.status for t in turns] == ["done", "done", "done", "failed"]
