"""A prompt longer than the context, and a thinking level, against the real llama-server (b11434, SmolLM2-135M,
two slots of 2,048 tokens: the ``llama_url`` fixture) and the Ollama replay (tests/ollama_replay.py: no Ollama binary
runs here).

llama-server answers an over-long prompt with HTTP 400 ``{"error": {"code": 400, "type":
"exceed_context_size_error", "message": "request (N tokens) exceeds the available context size (M tokens), ...",
"n_prompt_tokens": N, "n_ctx": M}}`` (tools/server), before its stream begins: RigDash's ContextOverflow carries
both sizes. Ollama, with its context shift off, answers 400 "the prompt is longer than the context length ..."
(llm/llama_server.go ``completionPromptForRequest``).
"""

from __future__ import annotations

import asyncio

import pytest

from inference.backends.base import ChatRequest, ContextOverflow, user_message
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend
from inference.backends.openai.chat import OpenAICompatBackend
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)

LONG = "the keeper lit the lamp " * 700  # about 3,500 tokens: over a 2,048-token slot


def _request(**extra) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": LONG}], max_tokens=4, **extra)


async def _drain(backend, request: ChatRequest) -> list:
    return [chunk async for chunk in backend.stream_chat(request)]


@pytest.mark.parametrize("backend_class", [LlamaCppBackend, OpenAICompatBackend])
async def test_llama_server_context_overflow_names_both_sizes(llama_url, backend_class):
    with pytest.raises(ContextOverflow) as overflow:
        await _drain(backend_class(llama_url), _request())
    error = overflow.value
    assert error.context_tokens == 2048 and error.prompt_tokens is not None and error.prompt_tokens > 2048
    assert not error.retryable and error.code == "context_overflow"
    assert f"{error.prompt_tokens} tokens" in user_message("rig", error)


async def test_llama_server_takes_a_reasoning_level(llama_url):
    """``reasoning_effort`` goes with a level; a template that reads none (SmolLM2's) answers as usual."""
    backend = LlamaCppBackend(llama_url)
    payload = backend._payload(_request(think="low"))
    assert payload["reasoning_effort"] == "low" and payload["chat_template_kwargs"] == {"enable_thinking": True}
    short = ChatRequest(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, think="low")
    chunks = await _drain(backend, short)
    assert chunks[-1].finish_reason in ("stop", "length")


def test_ollama_context_overflow_without_context_shift(ollama):
    ollama.context_shift = False
    request = ChatRequest(model="smollm2:135m", messages=[{"role": "user", "content": LONG}], max_tokens=4, num_ctx=512)
    with pytest.raises(ContextOverflow) as overflow:
        asyncio.run(_drain(OllamaBackend(ollama.url), request))
    assert "num_ctx" in str(overflow.value)
