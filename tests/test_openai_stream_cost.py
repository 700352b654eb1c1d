"""What streaming through /v1/chat/completions adds to reading llama-server directly (a measurement, not a timed
test: ``RIGDASH_BENCH_OPENAI=1 ./scripts/test tests/test_openai_stream_cost.py -s``; figures in docs/benchmarks.md).
Same definitions as the benchmark: TTFT = request sent -> first text; decode rate = (n - 1) / (t_last - t_first)."""

from __future__ import annotations

import json
import os
import statistics
import time

import httpx
import pytest
from django.conf import settings

from inference.board import apikeys
from inference.models import ChatSession
from tests.conftest import session_cookie_for

pytestmark = [
    pytest.mark.skipif(not os.environ.get("RIGDASH_BENCH_OPENAI"), reason="set RIGDASH_BENCH_OPENAI=1"),
    pytest.mark.llama,
    pytest.mark.django_db(transaction=True),
]
PAIRS, TOKENS = 6, 96


def _read(url: str, body: dict, headers: dict) -> tuple[float, float]:
    """(TTFT ms, decode tokens/s) of one streamed reply, counting chunks with text."""
    started, arrivals = time.perf_counter(), []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and (event["choices"][0].get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
    assert len(arrivals) > 10
    return (arrivals[0] - started) * 1000, (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _chat_ttft(web_url: str, cookie: str, session_id: int, body: dict) -> float:
    """TTFT of the chat path: the websocket's turn.send -> its first token frame (the browser's path, headless)."""
    from websockets.sync.client import connect

    url = web_url.replace("http://", "ws://") + f"/ws/chat/{session_id}/"
    with connect(url, additional_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}",
                                         "Origin": web_url}) as sock:  # fmt: skip
        json.loads(sock.recv(timeout=30))  # the session's snapshot
        params = {"max_tokens": body["max_tokens"], "temperature": body["temperature"], "seed": body["seed"]}
        started = time.perf_counter()
        sock.send(json.dumps({"type": "turn.send", "text": body["messages"][0]["content"], "params": params}))
        while True:
            frame = json.loads(sock.recv(timeout=60))
            if frame["type"] == "token" and frame.get("text"):
                ttft = (time.perf_counter() - started) * 1000
                break
        while json.loads(sock.recv(timeout=120))["type"] != "turn.end":
            pass
    return ttft


def test_streaming_through_v1_against_direct(web_url, celery_worker, rig, model_name, owner, llama_url):
    key = apikeys.api_key_create(owner=owner, name="bench")
    cookie = session_cookie_for(owner)
    body = {"model": model_name, "max_tokens": TOKENS, "temperature": 0.7, "seed": 11, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a story about a fox."}]}  # fmt: skip
    direct, via, chat = [], [], []
    for _ in range(PAIRS):  # alternated, so drift on a shared machine hits all three alike
        direct.append(_read(f"{llama_url}/v1/chat/completions", body, {}))
        via.append(_read(f"{web_url}/v1/chat/completions", body, {"Authorization": f"Bearer {key.secret}"}))
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
        chat.append(_chat_ttft(web_url, cookie, session.pk, body))
    added = [v[0] - d[0] for d, v in zip(direct, via, strict=True)]
    ratio = [v[1] / d[1] for d, v in zip(direct, via, strict=True)]
    print(
        f"\nOPENAI {PAIRS} pairs x {TOKENS} tokens: direct TTFT p50 {statistics.median(d[0] for d in direct):.1f} ms, "
        f"via /v1 {statistics.median(v[0] for v in via):.1f} ms; added TTFT p50 {statistics.median(added):.1f} ms "
        f"(max {max(added):.1f}); decode rate via/direct p50 {statistics.median(ratio):.3f} (min {min(ratio):.3f}); "
        f"chat path (websocket) TTFT p50 {statistics.median(chat):.1f} ms, added p50 "
        f"{statistics.median(c - d[0] for c, d in zip(chat, direct, strict=True)):.1f} ms"
    )
