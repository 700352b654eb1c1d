"""One conformance suite for every backend plug-in: the same tests, parameterised by backend.

llama.cpp and the generic OpenAI-compatible plug-in run against the real llama-server; Ollama against the
protocol replay in tests/ollama_replay.py (no Ollama binary can run here; the replay speaks Ollama's wire format).
Each runs twice: thinking off (``think`` left to the server, a model that does not reason) and on (a reasoning
model asked to think: a second llama-server whose chat template makes SmolLM2 reason, tests/reasoning_llama.py;
the replay's reasoning model).
Adding a backend: write its module, then add one ``Target`` factory to ``TARGETS`` below.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import pytest

from inference.backends import BACKENDS
from inference.backends.base import Backend, BackendUnavailable, ChatRequest, ModelNotFound
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend
from inference.backends.openai import OpenAICompatBackend
from tests.conftest import free_port, llama_busy_slots
from tests.ollama_replay import ollama_fixture, reasoner  # noqa: F401  (the ``ollama`` fixture)
from tests.reasoning_llama import reasoning_llama_fixture  # noqa: F401  (the ``reasoning_llama_url`` fixture)

LONG_PROMPT = "Write a long story about a lighthouse keeper and a storm, with many details."


@dataclass
class Target:
    """A backend under test and what the suite needs to know about its server."""

    backend: Backend
    model: str
    generating: Callable[[], bool]  # is the server decoding a reply for us right now?
    unknown_model_skip: str = ""  # why this backend cannot report an unknown model ("" if it can)
    think: bool | None = None  # a reasoning model asked to think

    def chat(self, content: str, **extra: Any) -> ChatRequest:
        return ChatRequest(model=self.model, messages=[{"role": "user", "content": content}], think=self.think, **extra)


def _llamacpp(request: pytest.FixtureRequest, think: bool) -> Target:
    url = request.getfixturevalue("reasoning_llama_url" if think else "llama_url")
    return Target(
        think=True if think else None,
        backend=LlamaCppBackend(url),
        model=request.getfixturevalue("model_name"),
        generating=lambda: llama_busy_slots(url) > 0,
        unknown_model_skip=(
            "llama-server serves the one model it was started with and ignores the request's model name, so it "
            "cannot report an unknown one; RigDash checks the name against list_models() when a session is created"
        ),
    )


def _openai(request: pytest.FixtureRequest, think: bool) -> Target:
    """The generic OpenAI-compatible plug-in against llama-server's own /v1/ endpoint: the standard protocol only (no
    timings, no template switches), as vLLM, LM Studio or LocalAI would be read. The reasoning server separates its
    thoughts by default, which is how such servers send them (``reasoning_content``)."""
    target = _llamacpp(request, think)
    url = target.backend.base_url
    return Target(
        think=target.think,
        backend=OpenAICompatBackend(url + "/v1"),  # as these servers' docs write the URL
        model=target.model,
        generating=target.generating,
        unknown_model_skip=target.unknown_model_skip,
    )


def _ollama(request: pytest.FixtureRequest, think: bool) -> Target:
    replay = request.getfixturevalue("ollama")
    replay.reply_tokens = 5000  # about 10 s at the replay's pace: long enough to be cancelled mid-reply
    model = "smollm2:135m"
    if think:
        model = reasoner().name
        replay.models[model] = reasoner()
    return Target(
        backend=OllamaBackend(replay.url),
        model=model,
        generating=lambda: replay.streams_open > 0,
        think=True if think else None,
    )


TARGETS: dict[str, Callable[[pytest.FixtureRequest, bool], Target]] = {
    "llamacpp": _llamacpp,
    "ollama": _ollama,
    "openai": _openai,
}
NEEDS_LLAMA = {"llamacpp", "openai"}


@pytest.fixture(
    params=[
        pytest.param(
            (name, think),
            id=f"{name}-{'thinking' if think else 'plain'}",
            marks=[pytest.mark.llama] if name in NEEDS_LLAMA else [],
        )
        for name in TARGETS
        for think in (False, True)
    ]
)
def target(request: pytest.FixtureRequest) -> Target:
    name, think = request.param
    return TARGETS[name](request, think)


def test_every_registered_backend_is_in_the_suite():
    assert set(TARGETS) == set(BACKENDS)


def test_health_is_ok_with_a_detail(target):
    health = asyncio.run(target.backend.health())
    assert health.ok, health.detail
    assert health.detail and isinstance(health.version, str)


def test_list_models_names_the_served_model(target):
    models = asyncio.run(target.backend.list_models())
    assert target.model in [m.name for m in models]
    assert all(m.size_bytes is None or m.size_bytes > 0 for m in models)


def test_on_sent_is_called_once_before_the_first_chunk(target):
    """The worker's claim waits for it (inference/worker/start.py); a plug-in that never called it would hold every
    claim for SENT_WAIT_S."""
    request = target.chat("Hi.", max_tokens=4)
    events: list[str] = []

    async def collect() -> None:
        async for _chunk in target.backend.stream_chat(request, on_sent=lambda: events.append("sent")):
            events.append("chunk")

    asyncio.run(collect())
    assert events.count("sent") == 1 and events[0] == "sent" and "chunk" in events, events


def test_stream_is_text_chunks_then_one_final_chunk_with_stats(target):
    request = target.chat("Name three colours.", max_tokens=16, temperature=0)

    async def collect():
        return [chunk async for chunk in target.backend.stream_chat(request)]

    chunks = asyncio.run(collect())
    *body, final = chunks
    assert all(chunk.finish_reason is None for chunk in body)
    # Earlier chunks may carry the backend's running stats (llama.cpp's per-token timings): never more
    # tokens than the final count.
    running = [chunk.stats.output_tokens for chunk in body if chunk.stats and chunk.stats.output_tokens is not None]
    assert running == sorted(running)
    text_chunks = [chunk for chunk in body if chunk.text or chunk.thinking]
    assert text_chunks and "".join(c.text + c.thinking for c in text_chunks).strip()
    thought = "".join(c.thinking for c in chunks)
    assert bool(thought.strip()) == bool(target.think), thought  # thinking is apart from the answer, and only asked
    assert final.finish_reason in ("stop", "length")
    stats = final.stats
    assert stats is not None
    assert stats.prompt_tokens and stats.prompt_tokens > 0
    assert stats.output_tokens and stats.output_tokens >= len(text_chunks)
    assert stats.output_tokens <= 16 + 1  # max_tokens honoured (+1: llama.cpp counts the end token)
    assert stats.decode_tps and stats.decode_tps > 0
    assert stats.raw
    assert all(count <= stats.output_tokens for count in running)
    # Speculative decoding: no draft model on either server, so no draft counts (tests/test_speculative.py has one).
    assert stats.draft_tokens is None and stats.draft_acceptance is None


def test_leaving_the_stream_early_stops_the_server_generating(target):
    request = target.chat(LONG_PROMPT, max_tokens=1000, temperature=0.7)

    async def read_three_then_leave() -> tuple[int, bool]:
        received, busy = 0, False
        async with aclosing(target.backend.stream_chat(request)) as stream:
            async for chunk in stream:
                assert chunk.finish_reason is None, "the reply ended before the test could leave it"
                received += bool(chunk.text or chunk.thinking)
                if received == 3:
                    busy = await asyncio.to_thread(target.generating)
                    break
        return received, busy

    _wait_until_idle(target, timeout_s=120)  # a reply another test left running would look like ours
    received, busy_before = asyncio.run(read_three_then_leave())
    assert received == 3 and busy_before, "the server should be mid-reply when the client leaves"
    _wait_until_idle(target, timeout_s=3)
    assert not target.generating(), "the server kept generating after the client closed the stream"


def _wait_until_idle(target: Target, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while target.generating() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_unknown_model_is_a_permanent_model_not_found(target):
    if target.unknown_model_skip:
        pytest.skip(target.unknown_model_skip)
    request = ChatRequest(
        model="no-such-model:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=4, think=target.think
    )

    async def collect():
        return [chunk async for chunk in target.backend.stream_chat(request)]

    with pytest.raises(ModelNotFound) as info:
        asyncio.run(collect())
    assert not info.value.retryable and info.value.code == "unknown_model"
    assert "no-such-model" in str(info.value)


def test_unreachable_server_is_a_retryable_unavailable(target):
    backend = type(target.backend)(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    health = asyncio.run(backend.health())
    assert not health.ok and "unreachable" in health.detail
    with pytest.raises(BackendUnavailable) as listing:
        asyncio.run(backend.list_models())
    assert listing.value.retryable

    async def collect():
        return [chunk async for chunk in backend.stream_chat(target.chat("hi", max_tokens=4))]

    with pytest.raises(BackendUnavailable):
        asyncio.run(collect())
