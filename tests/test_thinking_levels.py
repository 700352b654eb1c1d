"""Thinking levels: ``think`` is true, false or an effort level ("low" | "medium" | "high"), as Ollama's ThinkValue
takes it (api/types.go; server/routes.go refuses any thinking for a model without the capability: 400 ``"x" does not
support thinking``) and as llama-server takes ``reasoning_effort`` (tests/test_context_overflow.py, the real server).

Ollama: the replay (tests/ollama_replay.py; no Ollama binary runs here).
"""

from __future__ import annotations

import asyncio

import pytest

from inference.backends import capabilities
from inference.backends.base import ChatRequest
from inference.backends.ollama import OllamaBackend
from inference.errors import InvalidInput
from inference.turns.params import chat_request, params_validate
from tests.ollama_replay import OllamaReplay, reasoner, smollm2


@pytest.mark.parametrize("value", [True, False, "low", "medium", "high"])
def test_think_takes_a_bool_or_a_level(value):
    assert params_validate({"think": value}) == {"think": value}
    assert chat_request("m", [], 8, {"think": value}).think == value


@pytest.mark.parametrize("value", ["max", "on", 1, None, "HIGH"])
def test_think_refuses_anything_else(value):
    with pytest.raises(InvalidInput):
        params_validate({"think": value})


def test_which_servers_take_levels():
    assert capabilities("ollama").reasoning_levels and capabilities("llamacpp").reasoning_levels
    assert not capabilities("openai").reasoning_levels


def test_ollama_sends_the_level_and_reports_the_capability():
    replay = OllamaReplay(models=[smollm2(), reasoner()]).start()
    try:
        backend = OllamaBackend(replay.url)

        async def go() -> tuple[frozenset[str], frozenset[str], list]:
            request = ChatRequest(
                model="qwen3:0.6b", messages=[{"role": "user", "content": "hi"}], max_tokens=30, think="high"
            )
            chunks = [chunk async for chunk in backend.stream_chat(request)]
            return (
                await backend.model_capabilities("qwen3:0.6b"),
                await backend.model_capabilities("smollm2:135m"),
                chunks,
            )

        thinking, plain, chunks = asyncio.run(go())
        assert replay.last_request("/api/chat")["think"] == "high"
        assert any(chunk.thinking for chunk in chunks)  # a level is thinking on (ThinkValue.Bool)
        assert {"thinking", "think_levels", "completion"} <= thinking and "think_levels" not in plain
    finally:
        replay.stop()
