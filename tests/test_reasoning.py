"""Reasoning models end to end: thinking streamed as its own part of a turn (same batches and seqs as the answer),
stored with the turn, counted apart in the stats, asked for or not per turn (``params.think``).

Ollama runs against the replay's reasoning model (tests/ollama_replay.py: no Ollama binary runs here); llama.cpp
against a real llama-server whose chat template makes SmolLM2 reason (tests/reasoning_llama.py). The worker,
Redis, PostgreSQL and Channels are real.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from inference.errors import InvalidInput
from inference.live import state
from inference.models import ChatSession, Rig, Turn
from inference.turns import sessions
from inference.turns.params import params_validate
from inference.worker.pace import StreamMeter
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import WORDS, ollama_fixture, reasoner  # noqa: F401  (the ``ollama`` fixture)
from tests.reasoning_llama import reasoning_llama_fixture  # noqa: F401  (the ``reasoning_llama_url`` fixture)
from tests.wsclient import ChatSocket, token_frames

QWEN = reasoner().name


async def _open(session: ChatSession, user) -> ChatSocket:
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(user))
    assert (await sock.connect())[0]
    await sock.recv()  # session.snapshot
    return sock


async def _run_turn(sock: ChatSocket, params: dict) -> tuple[int, dict]:
    await sock.send({"type": "turn.send", "text": "Why is the sea salty?", "params": params})
    queued = await sock.recv_until(lambda f: f["type"] in ("turn.queued", "error"))
    assert queued["type"] == "turn.queued", queued
    turn_id = int(queued["turn"]["id"])
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    return turn_id, end


@pytest.fixture
def ollama_reasoning_session(db, owner, ollama):
    ollama.models[QWEN] = reasoner()
    ollama.thinking_tokens, ollama.reply_tokens = 7, 9
    rig = Rig.objects.create(name="ollama-think", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)
    return sessions.session_create(owner=owner, rig=rig, model_name=QWEN)


@pytest.mark.django_db(transaction=True)
async def test_ollama_thinking_streams_apart_and_is_stored(celery_worker, ollama_reasoning_session, owner, ollama):
    sock = await _open(ollama_reasoning_session, owner)
    turn_id, end = await _run_turn(sock, {"think": True, "max_tokens": 100})
    await sock.close()

    tokens = token_frames(sock.frames, turn_id)
    assert [f["seq_from"] for f in tokens] == [1] + [f["seq_to"] + 1 for f in tokens[:-1]]  # one seq for both parts
    thinking = "".join(f.get("thinking", "") for f in tokens)
    answer = "".join(f["text"] for f in tokens)
    expected_thought = " ".join(WORDS[(i + 5) % len(WORDS)] for i in range(7))
    assert thinking == expected_thought and answer == " ".join(WORDS[:9])
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.thinking_text == thinking == end["turn"]["thinking"]
    assert turn.reply_text == answer == end["turn"]["reply"]
    stats = turn.stats
    assert stats["output_events"] == 16 == stats["output_tokens"]  # eval_count counts the thinking too
    assert stats["thinking_tokens"] == 7 and stats["answer_tokens"] == 9
    assert 0 < stats["first_thought_ms"] == stats["ttft_ms"] < stats["first_answer_ms"]
    assert ollama.last_request("/api/chat")["think"] is True


@pytest.mark.django_db(transaction=True)
async def test_ollama_think_false_is_sent_and_the_reply_has_no_thinking(
    celery_worker, ollama_reasoning_session, owner, ollama
):
    sock = await _open(ollama_reasoning_session, owner)
    turn_id, end = await _run_turn(sock, {"think": False})
    await sock.close()
    assert ollama.last_request("/api/chat")["think"] is False
    assert not any("thinking" in f for f in token_frames(sock.frames, turn_id))
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.thinking_text == "" == end["turn"]["thinking"] and turn.reply_text == " ".join(WORDS[:9])
    assert turn.stats["thinking_tokens"] == 0 and turn.stats["first_thought_ms"] is None


@pytest.mark.django_db(transaction=True)
async def test_resync_mid_thinking_returns_thinking_and_seq(celery_worker, ollama_reasoning_session, owner, ollama):
    """A page that missed batches asks for the turn: the snapshot holds the thinking and the answer so far, up to
    its seq, exactly as the batches up to that seq held them."""
    ollama.thinking_tokens, ollama.token_interval_s = 300, 0.005
    sock = await _open(ollama_reasoning_session, owner)
    await sock.send({"type": "turn.send", "text": "Think hard.", "params": {"think": True, "max_tokens": 1000}})
    queued = await sock.recv_until(lambda f: f["type"] == "turn.queued")
    turn_id = int(queued["turn"]["id"])
    await sock.recv_until(lambda f: f["type"] == "token" and f["turn"] == turn_id and f["seq_to"] >= 5)
    await sock.send({"type": "turn.resync", "turn": turn_id})
    snap = (await sock.recv_until(lambda f: f["type"] == "turn.snapshot"))["turn"]
    await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id, timeout=30)
    await sock.close()
    held = [f for f in token_frames(sock.frames, turn_id) if f["seq_to"] <= snap["seq"]]
    assert snap["seq"] >= 5 and held[-1]["seq_to"] == snap["seq"]
    assert snap["thinking"] == "".join(f.get("thinking", "") for f in held)
    assert snap["reply"] == "".join(f["text"] for f in held)
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.thinking_text.startswith(snap["thinking"]) and len(turn.thinking_text.split()) == 300


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_llamacpp_reasoning_content_streams_as_thinking(celery_worker, owner, model_name, reasoning_llama_url):
    rig = await Rig.objects.acreate(
        name="llama-think", kind=Rig.Kind.LLAMACPP, base_url=reasoning_llama_url, queue=TEST_QUEUE
    )
    session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name=model_name)
    sock = await _open(session, owner)
    turn_id, end = await _run_turn(sock, {"think": True, "max_tokens": 12, "temperature": 0})
    off_id, off_end = await _run_turn(sock, {"think": False, "max_tokens": 12, "temperature": 0})
    await sock.close()

    thinking = "".join(f.get("thinking", "") for f in token_frames(sock.frames, turn_id))
    turn = await Turn.objects.aget(pk=turn_id)
    assert thinking.strip() and turn.thinking_text == thinking == end["turn"]["thinking"]
    assert turn.reply_text == ""  # SmolLM2 never closes the <think> block the template opened
    assert turn.stats["thinking_tokens"] == turn.stats["output_events"] and turn.stats["first_answer_ms"] is None
    off = await Turn.objects.aget(pk=off_id)
    assert off.thinking_text == "" == off_end["turn"]["thinking"] and off.reply_text.strip()


def test_think_param_is_a_boolean():
    assert params_validate({"think": False}) == {"think": False}
    with pytest.raises(InvalidInput):
        params_validate({"think": "yes"})
    with pytest.raises(InvalidInput):
        params_validate({"think": 1})


def test_live_list_keeps_thinking_beside_text_and_rewrites_both():
    batches = [
        state.encode_batch(1, 2, "", thinking="I think"),
        state.encode_batch(3, 3, "Hello", {"tokens": 3}, thinking=""),
    ]
    snap = state.decode_snapshot(batches)
    assert (snap.text, snap.thinking, snap.seq) == ("Hello", "I think", 3)
    assert '"k"' not in batches[1]  # a batch without thinking is stored as before

    class Pipe:
        def __init__(self) -> None:
            self.pushed: list[str] = []

        def delete(self, key: str) -> None:
            pass

        def rpush(self, key: str, value: str) -> None:
            self.pushed.append(value)

        def expire(self, key: str, ttl: int) -> None:
            pass

    pipe = Pipe()
    state.LiveList(1).append(pipe, 1, 3, "", {}, parts=["", "", "Hello"], thoughts=["I", " think", ""], rewrite=True)
    rebuilt = state.decode_snapshot(pipe.pushed)
    assert (rebuilt.text, rebuilt.thinking, rebuilt.seq) == ("Hello", "I think", 3)


def test_meter_splits_thinking_from_answer():
    meter = StreamMeter(t_request=10.0)
    meter.token(10.5, thought=True, answer=False)
    meter.token(10.6, thought=True, answer=False)
    meter.token(11.0)
    assert meter.ttft_ms == 500.0 and meter.live_stats()["thinking_tokens"] == 2
    split = meter.reasoning_stats(backend_output_tokens=4)  # the backend counted one more (an end token)
    assert split == {"thinking_tokens": 2, "answer_tokens": 2, "first_thought_ms": 500.0, "first_answer_ms": 1000.0}


@pytest.mark.django_db(transaction=True)
def test_api_clients_get_the_thoughts_streamed_as_the_server_streams_them(
    web_url, celery_worker, owner, model_name, reasoning_llama_url
):
    """Through RigDash's gateway with each official client, streamed: OpenAI's ``reasoning_content`` deltas,
    Anthropic's thinking block, Ollama's ``message.thinking``; their thoughts are the ones the server itself gives
    the same greedy request, as they come (more than one piece), not only in the ended reply."""
    import anthropic
    import httpx
    import ollama
    import openai

    from inference.board import apikeys

    Rig.objects.create(name="llama-think", kind=Rig.Kind.LLAMACPP, base_url=reasoning_llama_url, queue=TEST_QUEUE)
    messages = [{"role": "user", "content": "Why is the sea salty?"}]
    own = httpx.post(f"{reasoning_llama_url}/v1/chat/completions", timeout=120,
                     json={"messages": messages, "max_tokens": 12, "temperature": 0}).json()  # fmt: skip
    thoughts = own["choices"][0]["message"]["reasoning_content"]
    assert thoughts.strip()
    key = apikeys.api_key_create(owner=owner, name="thinker").secret

    chat = openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=120)
    chunks = chat.chat.completions.create(model=model_name, messages=messages, max_tokens=12, temperature=0,
                                          stream=True)  # fmt: skip
    deltas = [(chunk.choices[0].delta.model_extra or {}).get("reasoning_content") for chunk in chunks if chunk.choices]
    said = [d for d in deltas if d]
    assert len(said) > 1 and "".join(said) == thoughts

    claude = anthropic.Anthropic(base_url=web_url, api_key=key, max_retries=0, timeout=120)
    with claude.messages.stream(model=model_name, max_tokens=12, messages=messages,
                                extra_body={"temperature": 0}) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking"] and message.content[0].thinking == thoughts
    assert kinds.count("thinking") > 1 and "signature" in kinds  # streamed piece by piece, then closed

    llama = ollama.Client(host=web_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    streamed = llama.chat(model=model_name, messages=messages, stream=True,
                          options={"num_predict": 12, "temperature": 0})  # fmt: skip
    parts = [part.message.thinking for part in streamed]
    assert len([p for p in parts if p]) > 1 and "".join(p for p in parts if p) == thoughts
