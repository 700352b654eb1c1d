"""The worker's cost per token reading llama-server: with ``timings_per_token`` every event carries the running
timings, and reading, checking and copying them for each event was half of that cost. They are read from the last
event of each socket read (and the final one); the events before it are parsed for their text only. At 2,000
tokens/s x 16 streams that is the difference between a core and more than one (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio

import pytest

from inference.backends.base import BackendError, ChatRequest
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.llamacpp import chat as llamacpp
from inference.backends.llamacpp.chat import _chunk


async def test_the_running_timings_are_read_once_per_socket_read_not_per_token(synthetic_llama, monkeypatch):
    read = []
    real = llamacpp.stats_from_timings
    monkeypatch.setattr(llamacpp, "stats_from_timings", lambda timings: read.append(1) or real(timings))
    gates = 0

    async def gate() -> None:  # as the worker's: the next read waits for the next batch (10 ms for one turn)
        nonlocal gates
        gates += 1
        await asyncio.sleep(0.01)

    prompt = [{"role": "user", "content": "[synthetic rate=5000 tokens=2000 ttft=5]"}]
    request = ChatRequest(model="synthetic", messages=prompt, max_tokens=2000)
    chunks = [chunk async for chunk in LlamaCppBackend(synthetic_llama[0]).stream_chat(request, read_gate=gate)]

    assert sum(1 for c in chunks if c.text) == 2000
    final = chunks[-1]
    assert final.finish_reason == "length" and final.stats is not None and final.stats.output_tokens == 2000
    assert len(read) <= gates + 2 and len(read) < 2000 / 10  # once a read (and the end), not once a token
    timed = [c for c in chunks if c.stats is not None]
    assert timed[0].stats.prompt_tokens == 1  # the first read's: the quota check still reads the prompt's size
    assert all(c.context_tokens for c in timed)  # and the worker's live context follows every read


def test_timings_not_read_are_still_checked_to_be_an_object_and_the_final_ones_in_full():
    odd = '{"choices":[{"delta":{"content":"a"}}],"timings":{"prompt_n":"twelve"}}'
    assert _chunk(odd, timings=False).stats is None  # superseded by the next event's, never read
    with pytest.raises(BackendError):
        _chunk(odd)
    with pytest.raises(BackendError):
        _chunk('{"choices":[{"delta":{"content":"a"}}],"timings":[1]}', timings=False)
    with pytest.raises(BackendError):  # a finish reason's timings are the reply's stats: always read
        _chunk('{"choices":[{"delta":{},"finish_reason":"stop"}],"timings":{"predicted_n":"x"}}', timings=False)
    with pytest.raises(BackendError) as raised:  # NaN is not JSON (RFC 8259), read or not
        _chunk('{"choices":[{"delta":{"content":"a"}}],"timings":{"prompt_n":NaN}}', timings=False)
    assert "not JSON" in raised.value.detail  # type: ignore[attr-defined]
