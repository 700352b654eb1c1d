"""The llama.cpp plug-in against the real llama-server."""

from __future__ import annotations

import asyncio

import pytest

from inference.backends.base import BackendUnavailable, ChatRequest
from inference.backends.llamacpp import LlamaCppBackend
from tests.conftest import free_port

pytestmark = pytest.mark.llama


def test_health_and_models(llama_url, model_name):
    backend = LlamaCppBackend(llama_url)
    assert asyncio.run(backend.health()).ok
    models = asyncio.run(backend.list_models())
    assert [m.name for m in models] == [model_name]
    # The server's own context for a request (-c 4096 over 2 slots), not SmolLM2's trained 8192.
    assert (models[0].context_length, models[0].context_source) == (2048, "server")
    assert models[0].details["n_ctx_train"] == 8192
    assert models[0].size_bytes and models[0].size_bytes > 50_000_000


def test_stream_yields_text_and_llamacpp_timings(llama_url, model_name):
    async def collect():
        request = ChatRequest(
            model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, temperature=0
        )
        return [chunk async for chunk in LlamaCppBackend(llama_url).stream_chat(request)]

    chunks = asyncio.run(collect())
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length")
    assert final.stats is not None and final.stats.prompt_tokens > 0
    text_chunks = [c for c in chunks if c.text]
    # llama.cpp counts the end-of-generation token in predicted_n; it carries no text.
    eos = 1 if final.finish_reason == "stop" else 0
    assert len(text_chunks) == final.stats.output_tokens - eos
    assert final.stats.raw["predicted_n"] == final.stats.output_tokens


def test_unreachable_server_is_a_retryable_error():
    backend = LlamaCppBackend(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    health = asyncio.run(backend.health())
    assert not health.ok and "unreachable" in health.detail
    with pytest.raises(BackendUnavailable) as info:
        asyncio.run(backend.list_models())
    assert info.value.retryable
