"""Backend errors classed by what they say, not by when they arrive (inference/backends/failures.py): Ollama sends
a failure after its stream began as an ``{"error"}`` line with HTTP 200, and the same words with a status before.

Ollama: the replay (tests/ollama_replay.py; no Ollama binary runs here). llama.cpp: a scripted HTTP server for the
error answers (tests/test_sse_client.py's ``serve``); the worker end to end is real (Celery, Redis, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from inference.backends import failures
from inference.backends.base import (
    BackendError,
    BackendOutOfMemory,
    BackendUnavailable,
    ChatRequest,
    ContextOverflow,
    ModelLoadFailed,
    ModelLoading,
    ModelNotFound,
    ModelNotLoaded,
    ThinkingNotSupported,
    user_message,
)
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend
from inference.models import Rig, Turn
from inference.turns import sessions
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import WORDS, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.test_sse_client import serve
from tests.wsclient import ChatSocket

OOM = "model requires more system memory (12.3 GiB) than is available (7.6 GiB)"


@pytest.mark.parametrize(
    ("message", "status", "kind", "retryable"),
    [
        (OOM, 500, BackendOutOfMemory, False),
        (OOM, None, BackendOutOfMemory, False),
        ("CUDA error: out of memory", None, BackendOutOfMemory, False),
        ("llama runner process has terminated: cudaMalloc failed: out of memory", 500, BackendOutOfMemory, False),
        ("Loading model", 503, ModelLoading, True),
        ("timed out waiting for llama runner to start - progress 0.50", 500, ModelLoading, True),
        ("server busy, please try again.  maximum pending requests exceeded", 503, ModelLoading, True),
        (
            "model runner has unexpectedly stopped, this may be due to resource limitations",
            None,
            BackendUnavailable,
            True,
        ),
        ("model 'x' not found", 404, ModelNotFound, False),
        ("model name=broken failed to load", 500, ModelLoadFailed, False),  # llama-server's router
        ("model is not loaded", 400, ModelNotLoaded, False),  # a router started with --no-models-autoload
        (
            "llama runner process has terminated: error loading model: unable to load model: /m/x",
            500,
            ModelLoadFailed,
            False,
        ),
        ("something broke", 502, BackendUnavailable, True),
        ("something broke", None, BackendError, False),
        ('"smollm2:135m" does not support thinking', 400, ThinkingNotSupported, False),
    ],
)
def test_classed_by_words_then_status(message, status, kind, retryable):
    error = failures.classify("Ollama", message, status=status)
    assert type(error) is kind and error.retryable is retryable
    assert message in str(error) or kind is ThinkingNotSupported


def test_out_of_memory_and_loading_messages_say_what_to_do():
    oom = str(failures.classify("Ollama", OOM))
    assert "not enough memory" in oom and "smaller model" in oom
    assert "try again shortly" in str(failures.classify("llama-server", "Loading model", status=503))


# llama-server b11434's answer to a prompt longer than -c (tests/test_context_overflow.py asks the real server).
OVERFLOW = {
    "code": 400,
    "message": "request (631 tokens) exceeds the available context size (256 tokens), try increasing it",
    "type": "exceed_context_size_error",
    "n_prompt_tokens": 631,
    "n_ctx": 256,
}


def test_context_overflow_has_its_class_both_sizes_and_advice():
    error = failures.classify_object("llama-server", OVERFLOW, status=400)
    assert isinstance(error, ContextOverflow) and not error.retryable
    assert (error.prompt_tokens, error.context_tokens) == (631, 256)
    shown = user_message("rig-a", error)  # the user is told the sizes and what to do, no server words beyond them
    assert "631 tokens" in shown and "context of 256" in shown and "new chat" in shown and "num_ctx" in shown
    # Ollama's own words (llm/llama_server.go completionPromptForRequest), and llama-server's body forwarded as text.
    ollama_words = (
        "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust"
        " the context length in settings, or use a model with a longer context length"
    )
    assert isinstance(failures.classify("Ollama", ollama_words, status=400), ContextOverflow)
    forwarded = failures.classify("Ollama", json.dumps({"error": OVERFLOW}), status=400)
    assert isinstance(forwarded, ContextOverflow) and (forwarded.prompt_tokens, forwarded.context_tokens) == (631, 256)


def test_a_model_that_fails_to_load_tells_the_user_trying_again_will_not_help():
    error = failures.classify_object("Rig r", {"code": 500, "message": "model name=qwen-bad failed to load",
                                               "type": "server_error"}, status=500)  # fmt: skip
    assert isinstance(error, ModelLoadFailed) and not error.retryable
    said = user_message("r", error)
    assert "could not load this model" in said and "will fail the same way" in said and "qwen-bad" not in said


def test_thinking_refusal_is_its_own_clear_message():
    error = failures.classify("Ollama", '"smollm2:135m" does not support thinking', status=400)
    assert isinstance(error, ThinkingNotSupported)
    assert "does not think" in user_message("rig-a", error) and "model default" in user_message("rig-a", error)


def test_error_object_inside_a_stream_keeps_its_status():
    """llama-server's error event names its status as ``code``: a 500 stays retryable, a 400 stays permanent."""
    server_error = failures.classify_object("llama-server", {"code": 500, "message": "decode failed", "type": "x"})
    assert isinstance(server_error, BackendUnavailable) and server_error.retryable
    bad_request = failures.classify_object("llama-server", {"code": 400, "message": "bad", "type": "x"})
    assert type(bad_request) is BackendError and not bad_request.retryable


def test_ollama_thinking_refusal_from_the_replay(ollama):
    async def ask() -> list:
        request = ChatRequest(
            model="smollm2:135m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, think="high"
        )
        return [chunk async for chunk in OllamaBackend(ollama.url).stream_chat(request)]

    with pytest.raises(ThinkingNotSupported):
        asyncio.run(ask())


def test_ollama_unknown_error_line_mid_stream_is_a_retryable_500(ollama):
    """Ollama's streamResponse (server/routes.go) sends 500 for an error naming no status; mid-stream only the
    words go out, so words RigDash does not know are that 500: retryable, as the same error before the stream."""
    ollama.error_after_tokens, ollama.stream_error = 2, "something broke in the runner"
    with pytest.raises(BackendUnavailable) as error:
        _ollama_chunks(ollama.url)
    assert error.value.retryable


def _ollama_chunks(url: str) -> list:
    async def collect() -> list:
        request = ChatRequest(model="smollm2:135m", messages=[{"role": "user", "content": "hi"}], max_tokens=50)
        return [chunk async for chunk in OllamaBackend(url).stream_chat(request)]

    return asyncio.run(collect())


def test_ollama_error_line_mid_stream_is_classed_by_its_words(ollama):
    ollama.error_after_tokens, ollama.stream_error = 3, OOM
    with pytest.raises(BackendOutOfMemory) as oom:
        _ollama_chunks(ollama.url)
    assert not oom.value.retryable and "12.3 GiB" in str(oom.value)
    ollama.stream_error = "model runner has unexpectedly stopped"
    with pytest.raises(BackendUnavailable) as crashed:
        _ollama_chunks(ollama.url)
    assert crashed.value.retryable


def test_ollama_same_words_before_the_stream_class_the_same(ollama):
    ollama.fail_status, ollama.fail_message = 500, OOM
    with pytest.raises(BackendOutOfMemory):
        _ollama_chunks(ollama.url)
    ollama.fail_status, ollama.fail_message = 500, "timed out waiting for llama runner to start - progress 0.00"
    with pytest.raises(ModelLoading) as loading:
        _ollama_chunks(ollama.url)
    assert loading.value.retryable


async def _llama_chunks(url: str) -> list:
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return [chunk async for chunk in LlamaCppBackend(url).stream_chat(request)]


async def test_llamacpp_loading_and_mid_stream_errors_are_classed():
    body = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).encode()
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    async with serve([head % len(body), body]) as (url, _):
        with pytest.raises(ModelLoading):
            await _llama_chunks(url)
    event = json.dumps({"error": {"code": 500, "message": "failed to allocate compute buffer"}})
    stream = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        + b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        + f"data: {event}\n\n".encode()
    )
    async with serve([stream]) as (url, _):
        with pytest.raises(BackendOutOfMemory):
            await _llama_chunks(url)
    event = json.dumps({"error": {"code": 500, "message": "Invalid input batch", "type": "server_error"}})
    stream = stream.replace(b"failed to allocate compute buffer", b"Invalid input batch")
    async with serve([stream]) as (url, _):
        with pytest.raises(BackendUnavailable) as error:  # the event's 500 kept: retryable
            await _llama_chunks(url)
    assert error.value.retryable


@pytest.mark.django_db(transaction=True)
async def test_a_turn_failed_mid_stream_keeps_its_text_and_says_why(celery_worker, owner, ollama):
    ollama.reply_tokens, ollama.error_after_tokens, ollama.stream_error = 40, 5, OOM
    rig = await Rig.objects.acreate(name="ollama-err", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)
    session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name="smollm2:135m")
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    await sock.send({"type": "turn.send", "text": "Go.", "params": {"max_tokens": 100}})
    turn_id = int((await sock.recv_until(lambda f: f["type"] == "turn.queued"))["turn"]["id"])
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    await sock.close()
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.FAILED and turn.finish_reason == "out_of_memory"
    assert turn.reply_text == " ".join(WORDS[:5]) == end["turn"]["reply"]
    assert "not enough memory" in turn.error and "12.3 GiB" in end["turn"]["error"]
