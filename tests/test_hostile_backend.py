"""A backend that sends valid framing with contents its protocol never sends: the turn fails at once, keeping its text.

The llama.cpp cases run the real worker code against a socket server that speaks HTTP and SSE; the Ollama cases run
the real Ollama plug-in (the official client) over an in-memory httpx transport, since no Ollama can run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.backends import sse
from inference.backends.base import UNREADABLE_EVENT, BackendBadEvent, BackendError, ChatRequest
from inference.backends.llamacpp.chat import _chunk
from inference.backends.ollama import OllamaBackend
from inference.models import ChatSession, Rig, Turn
from inference.worker import start as starts
from tests.ollama_replay import WORDS, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)

BAD_EVENTS = {
    "not JSON": b"data: this is not json\n\n",
    "JSON not an object": b"data: [1, 2, 3]\n\n",
    "invalid UTF-8": b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n',
    "an escaped lone surrogate": b'data: {"choices":[{"delta":{"content":"\\ud800"}}]}\n\n',
    "NaN": b'data: {"choices":[{"delta":{"content":"a"}}],"timings":{"predicted_n":NaN}}\n\n',
    "nested too deep": b'data: {"choices":[{"delta":{"content":"a"}}],"x":' + b"[" * 5000 + b"]" * 5000 + b"}\n\n",
    "content of the wrong type": b'data: {"choices":[{"delta":{"content":5}}]}\n\n',
    "choices of the wrong type": b'data: {"choices":"x"}\n\n',
    "timings of the wrong type": b'data: {"choices":[{"delta":{"content":"a"}}],"timings":[1]}\n\n',
    "finish reason of the wrong type": b'data: {"choices":[{"delta":{},"finish_reason":{"a":1}}]}\n\n',
}


def _event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@contextlib.contextmanager
def sse_server(body: bytes) -> Iterator[str]:
    """Answers each POST with ``body`` as one chunked SSE response and keeps the connection open (a backend that
    would go on); any other request gets a 404."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            held.append(conn)
            with contextlib.suppress(OSError):
                request = conn.recv(65536)
                if not request.startswith(b"POST"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                conn.sendall(head + f"{len(body):x}\r\n".encode() + body + b"\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_a_llamacpp_event_rigdash_cannot_read_fails_the_turn_at_once_keeping_its_text(owner, case):
    body = _event({"choices": [{"delta": {"content": "Hello"}}]}) + BAD_EVENTS[case]
    with sse_server(body) as url:
        rig = Rig.objects.create(name="odd", kind="llamacpp", base_url=url, queue="rig.odd")
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
        turn = Turn.objects.create(session=session, user_text="hello")
        started = time.monotonic()
        assert starts.turn_run(turn.pk) == "ran"
        took = time.monotonic() - started
    turn.refresh_from_db()
    assert (turn.status, turn.reply_text, turn.error) == (Turn.Status.FAILED, "Hello", f"Rig odd: {UNREADABLE_EVENT}.")
    assert took < 5, "the turn waited for a timeout instead of failing at once"
    assert not Turn.objects.filter(session__rig=rig, status__in=Turn.RUNNING).exists()  # the slot is free


@pytest.mark.django_db(transaction=True)
def test_a_nul_character_in_a_reply_is_stored_as_the_replacement_character_and_the_turn_ends(owner):
    """PostgreSQL stores no NUL (U+0000) in text or jsonb, and a model may decode one (a byte token 0): the worker
    replaces it as it reads the chunk, so the live text, the checkpoints and the end hold the same storable text,
    and the turn ends (a text that cannot be stored would leave it decoding)."""
    call = {"index": 0, "id": "c\u0000", "type": "function", "function": {"name": "f", "arguments": '{"a": "\u0000"}'}}
    body = (_event({"choices": [{"delta": {"reasoning_content": "th\u0000ink"}}]})
            + _event({"choices": [{"delta": {"content": "Hel\u0000lo"}}]})
            + _event({"choices": [{"delta": {"tool_calls": [call]}}]})
            + _event({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}) + b"data: [DONE]\n\n")  # fmt: skip
    with sse_server(body) as url:
        rig = Rig.objects.create(name="nul", kind="llamacpp", base_url=url, queue="rig.nul")
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
        turn = Turn.objects.create(session=session, user_text="hello")
        assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert (turn.status, turn.reply_text, turn.thinking_text) == (Turn.Status.DONE, "Hel\ufffdlo", "th\ufffdink")
    [stored] = turn.stats["tool_calls"]
    assert stored["id"] == "c\ufffd" and json.loads(stored["function"]["arguments"]) == {"a": "\ufffd"}
    from inference.live import state as live

    published = live.snapshot(turn.pk)  # what the chat's page and the API's streams were sent
    assert (published.text, published.thinking) == ("Hel\ufffdlo", "th\ufffdink")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "line",
    [
        b'{"model":"smollm2:135m","message":{"role":"assistant","content":" \xff\xfe"},"done":false}',
        b'{"model":"smollm2:135m","message":{"role":"assistant","content":" caf\xc3"},"done":false}',  # cut mid-char
        b"\xed\xa0\x80",  # a UTF-16 surrogate encoded as UTF-8: not UTF-8
    ],
    ids=["bytes not UTF-8", "truncated multibyte", "encoded surrogate"],
)
def test_an_ollama_line_that_is_not_utf8_fails_the_turn_at_once_keeping_its_text(owner, ollama, line):
    """Ollama's NDJSON is read strictly: httpx's line reader would have replaced the bytes with U+FFFD and the
    reply would have gone on with text the backend never sent. On the protocol replay (tests/ollama_replay.py)."""
    ollama.reply_tokens, ollama.token_interval_s = 40, 0.01
    ollama.raw_line_after_tokens, ollama.raw_line = 3, line
    rig = Rig.objects.create(name="odd-ollama", kind="ollama", base_url=ollama.url, queue="rig.odd-ollama")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="smollm2:135m")
    turn = Turn.objects.create(session=session, user_text="hello", params={"max_tokens": 40})
    started = time.monotonic()
    assert starts.turn_run(turn.pk) == "ran"
    took = time.monotonic() - started
    turn.refresh_from_db()
    assert (turn.status, turn.error) == (Turn.Status.FAILED, f"Rig odd-ollama: {UNREADABLE_EVENT}.")
    assert turn.reply_text == " ".join(WORDS[:3]) and "\ufffd" not in turn.reply_text  # the three good lines
    assert took < 5, "the turn waited for a timeout instead of failing at once"
    assert not Turn.objects.filter(session__rig=rig, status__in=Turn.RUNNING).exists()  # the slot is free


def _ollama_stream(body: bytes) -> list[str]:
    """Run the Ollama plug-in's chat stream over a transport that answers ``body``; the texts it yielded."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/x-ndjson"})

    backend = OllamaBackend("http://ollama.invalid:11434")
    backend.transport = httpx.MockTransport(answer)
    texts: list[str] = []

    async def read() -> None:
        async for chunk in backend.stream_chat(ChatRequest(model="m", messages=[], max_tokens=8)):
            texts.append(chunk.text)

    try:
        asyncio.run(read())
    finally:
        texts.append("<end>")
    return texts


def _line(content: Any) -> bytes:
    return json.dumps({"model": "m", "created_at": "2026-01-01T00:00:00Z", "message": content, "done": False}).encode()


@pytest.mark.parametrize(
    "line",
    [
        b"this is not json",
        b"[1, 2]",
        b"42",
        _line({"role": "assistant", "content": 5}),
        _line("text"),
        b'{"done": 3}',
        _line({"role": "assistant", "content": "caf"}).replace(b"caf", b"caf\xc3"),
    ],
)
def test_an_ollama_line_rigdash_cannot_read_raises_the_unreadable_event_error(line):
    good = _line({"role": "assistant", "content": "Hello"})
    with pytest.raises(BackendError) as info:
        _ollama_stream(good + b"\n" + line + b"\n")
    assert str(info.value) == UNREADABLE_EVENT


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
LEAF = JSON | st.sampled_from(["stop", "length", "Hello", ""])
LLAMA_EVENT = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={"delta": st.fixed_dictionaries({}, optional={"content": LEAF}) | LEAF, "finish_reason": LEAF},
            )
            | LEAF,
            max_size=2,
        )
        | LEAF,
        "timings": st.dictionaries(st.sampled_from(["prompt_n", "predicted_n", "cache_n", "predicted_ms"]), LEAF)
        | LEAF,
        "error": LEAF,
    },
)
OLLAMA_LINE = st.fixed_dictionaries(
    {},
    optional={
        "model": LEAF,
        "created_at": LEAF,
        "message": st.fixed_dictionaries({}, optional={"role": LEAF, "content": LEAF}) | LEAF,
        "done": LEAF,
        "done_reason": LEAF,
        "eval_count": LEAF,
        "eval_duration": LEAF,
        "error": LEAF,
    },
)


def _llama_events(parts: list[bytes]) -> None:
    parser = sse.SSEParser()
    try:
        for part in parts:
            for data in parser.feed(part):
                if data != "[DONE]":
                    _chunk(data)
    except sse.EventError as exc:  # what llamacpp.stream_chat turns into BackendBadEvent
        raise BackendError(str(exc)) from exc
    except sse.ProtocolError:
        pass  # framing errors: stream_chat ends the turn as an unavailable backend


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=6))
def test_the_sse_reader_raises_only_the_backend_error_for_any_bytes(parts):
    with contextlib.suppress(BackendError):
        _llama_events([b"data: " + part + b"\n\n" for part in parts] + parts)


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON | LLAMA_EVENT, max_size=4))
def test_the_llamacpp_event_reader_raises_only_the_backend_error_for_any_json(events):
    with contextlib.suppress(BackendError):
        _llama_events([_event(event) for event in events])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | st.lists(JSON | OLLAMA_LINE, max_size=4).map(lambda ls: _ndjson(ls)))
def test_the_ollama_chunk_reader_raises_only_the_backend_error_for_any_bytes_or_json(body):
    with contextlib.suppress(BackendError):
        texts = _ollama_stream(body)
        assert all(isinstance(text, str) for text in texts)


def _ndjson(lines: list[Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.mark.django_db
def test_ordinary_users_see_the_rigs_name_and_a_plain_reason_and_staff_the_detail(owner, admin_user):
    from django.test import Client

    from tests.conftest import free_port

    port = free_port()
    rig = Rig.objects.create(name="down", kind="llamacpp", base_url=f"http://127.0.0.1:{port}", queue="rig.down")
    user, staff = Client(), Client()
    user.force_login(owner)
    staff.force_login(admin_user)
    plain = user.get(f"/api/rigs/{rig.pk}/models").json()["error"]["message"]
    assert plain.startswith("Rig down: the backend could not be reached") and str(port) not in plain
    assert str(port) in staff.get(f"/api/rigs/{rig.pk}/models").json()["error"]["message"]
    refused = user.post("/sessions/new", {"rig": rig.pk, "model": "m"})
    assert (
        b"Rig down: the backend could not be reached" in refused.content and str(port).encode() not in refused.content
    )


@pytest.mark.parametrize(
    "call",
    [{"index": 0, "function": "get_weather"}, {"index": 0, "function": {"name": 7}},
     {"index": 0, "function": {"name": "f", "arguments": {"city": "Oslo"}}}],
    ids=["function a string", "name a number", "arguments an object"],
)  # fmt: skip
def test_a_tool_call_delta_of_another_shape_is_a_bad_event(call):
    """Every API's writer reads a delta's ``function`` as an object of strings: a server that sends another shape
    ends the reply as an unreadable event, not a crash in one API's stream."""
    with pytest.raises(BackendBadEvent):
        _chunk(json.dumps({"choices": [{"delta": {"tool_calls": [call]}}]}))
    assert _chunk(json.dumps({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]}))
