"""The replay (tests/ollama_replay.py) behaves as the v0.32 server series does where RigDash depends on it: metrics
left out when zero, thinking lines, gin's 404/405, a real load wait, an unload that waits for the running reply.
Plain HTTP against the replay, and the plug-in where it reads what changed."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx

from inference.backends.base import ChatRequest
from inference.backends.ollama import OllamaBackend
from tests.ollama_replay import API_VERSION, ollama_fixture, reasoner  # noqa: F401  (the ``ollama`` fixture)


def _lines(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=30) as response:
        assert response.status_code == 200
        return [json.loads(line) for line in response.iter_lines() if line]


def test_zero_metrics_are_left_out_and_the_plugin_copes(ollama):
    ollama.reply_tokens = 0
    final = _lines(ollama.url, {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}]})[-1]
    assert final["done"] and "eval_count" not in final and final["prompt_eval_count"] > 0

    async def collect() -> list:
        request = ChatRequest(model="smollm2:135m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return [chunk async for chunk in OllamaBackend(ollama.url).stream_chat(request)]

    (chunk,) = asyncio.run(collect())
    assert chunk.finish_reason and chunk.stats is not None and chunk.stats.output_tokens is None


def test_thinking_lines_come_first_with_empty_content(ollama):
    ollama.models[reasoner().name] = reasoner()
    ollama.thinking_tokens, ollama.reply_tokens = 3, 2
    lines = _lines(ollama.url, {"model": reasoner().name, "messages": [{"role": "user", "content": "hi"}]})
    thinking = [line["message"].get("thinking") for line in lines[:-1]]
    assert thinking[:3] == [t for t in thinking[:3] if t] and not any(thinking[3:])
    assert all(line["message"]["content"] == "" for line in lines[:3])
    assert lines[-1]["eval_count"] == 5  # eval_count counts the thinking tokens too
    refused = httpx.post(f"{ollama.url}/api/chat", json={"model": "smollm2:135m", "think": True,
                                                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert refused.status_code == 400 and "does not support thinking" in refused.json()["error"]


def test_routing_is_gins(ollama):
    unknown = httpx.get(f"{ollama.url}/api/nothing")
    assert unknown.status_code == 404 and unknown.text == "404 page not found"
    wrong_method = httpx.get(f"{ollama.url}/api/chat")
    assert wrong_method.status_code == 405 and wrong_method.text == "405 method not allowed"
    assert httpx.get(f"{ollama.url}/").text == "Ollama is running"
    assert httpx.get(f"{ollama.url}/api/version").json() == {"version": API_VERSION}


def test_loading_is_a_real_wait_and_unload_waits_for_the_running_reply(ollama):
    ollama.load_s, ollama.reply_tokens, ollama.token_interval_s = 0.3, 30, 0.01
    started = time.monotonic()
    final = _lines(ollama.url, {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}]})[-1]
    assert time.monotonic() - started >= 0.3 and final["load_duration"] >= 300_000_000
    again = _lines(ollama.url, {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}]})[-1]
    assert again["load_duration"] < 100_000_000  # loaded already

    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "go"}]}
    got: list[list[dict]] = []
    reply = threading.Thread(target=lambda: got.append(_lines(ollama.url, body)))
    reply.start()
    time.sleep(0.05)
    asked = time.monotonic()
    asyncio.run(OllamaBackend(ollama.url).unload_model("smollm2:135m"))
    waited = time.monotonic() - asked
    reply.join(timeout=10)
    assert got and got[0][-1]["done"] and got[0][-1]["eval_count"] == 30  # the reply ran to its end
    assert waited >= 0.15  # the unload answered once the reply (0.3 s of tokens) was done, not at once
    assert httpx.get(f"{ollama.url}/api/ps").json()["models"] == []
