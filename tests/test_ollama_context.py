"""The context window of an Ollama rig: /api/ps's context_length for the loaded model (one sequence's num_ctx),
or the turn's own num_ctx, feeding the chat's gauge (stats context_limit), the board (its progress n_ctx) and the
stored stats. Ollama runs as the replay (tests/ollama_replay.py); the worker, Redis and PostgreSQL are real."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from inference.backends.base import ChatRequest
from inference.backends.ollama import OllamaBackend
from inference.errors import InvalidInput
from inference.models import Rig, Turn
from inference.turns import sessions
from inference.turns.params import params_validate
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.wsclient import ChatSocket, token_frames


def test_context_window_is_the_loaded_models_num_ctx(ollama):
    backend = OllamaBackend(ollama.url)
    assert asyncio.run(backend.context_window("smollm2:135m")) is None  # not loaded: the server's default is unknown

    async def chat() -> None:
        request = ChatRequest(model="smollm2:135m", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                              num_ctx=8192)  # fmt: skip
        async for _ in backend.stream_chat(request):
            pass

    asyncio.run(chat())
    assert asyncio.run(backend.context_window("smollm2:135m")) == 8192
    assert asyncio.run(backend.context_window("tinyllama")) is None


def test_num_ctx_is_a_bounded_integer_param():
    assert params_validate({"num_ctx": 8192}) == {"num_ctx": 8192}
    with pytest.raises(InvalidInput):
        params_validate({"num_ctx": 16})


@pytest.mark.django_db(transaction=True)
async def test_an_ollama_turn_fills_the_context_gauge(celery_worker, owner, ollama):
    ollama.reply_tokens = 30
    rig = await Rig.objects.acreate(name="ollama-ctx", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)
    session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name="smollm2:135m")
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    await sock.send({"type": "turn.send", "text": "Hello there.", "params": {"num_ctx": 8192, "max_tokens": 50}})
    turn_id = int((await sock.recv_until(lambda f: f["type"] == "turn.queued"))["turn"]["id"])
    await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    await sock.close()
    assert ollama.last_request("/api/chat")["options"]["num_ctx"] == 8192
    live = [f["stats"] for f in token_frames(sock.frames, turn_id)]
    # The window is read beside the request: the first batch may go out before it is known.
    assert live[-1]["context_limit"] == 8192 and all(s["context_limit"] in (None, 8192) for s in live)
    assert 0 < live[-1]["context_tokens"] < 8192  # the prompt's estimate plus the tokens so far
    turn = await Turn.objects.aget(pk=turn_id)
    timings = turn.stats["backend_timings"]
    assert turn.stats["context_limit"] == 8192
    assert turn.stats["context_tokens"] == timings["prompt_eval_count"] + timings["eval_count"]
