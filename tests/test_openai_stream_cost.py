"""What streaming through /v1/chat/completions adds to reading llama-server directly, beside what the chat's websocket
adds (a measurement, not a timed test: ``RIGDASH_BENCH_OPENAI=1 ./scripts/test tests/test_openai_stream_cost.py -s``;
figures in docs/benchmarks.md). Same definitions as the benchmark (/work/shared/reference/performance.md): TTFT =
request sent -> first text; decode rate = (n - 1) / (t_last - t_first) over the pieces with text.

Each round reads the same seeded 96-token reply four ways, in a rotating order so that drift on a shared machine hits
all alike: llama-server directly (twice: the second read against the first is the floor, what this machine's noise
alone "adds" without RigDash), through RigDash's /v1/, and through the chat's websocket."""

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
ROUNDS, TOKENS = int(os.environ.get("RIGDASH_BENCH_ROUNDS", "12")), 96
Reading = tuple[float, float, float]  # TTFT ms, decode tokens/s, first byte of the answer ms (submit done)


def _rate(arrivals: list[float]) -> float:
    assert len(arrivals) > 10
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _read(url: str, body: dict, headers: dict) -> Reading:
    """One streamed reply over a fresh HTTP connection, counting chunks with text."""
    started, arrivals, first_byte = time.perf_counter(), [], 0.0
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            first_byte = first_byte or time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and (event["choices"][0].get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
    return (arrivals[0] - started) * 1000, _rate(arrivals), (first_byte - started) * 1000


def _chat(web_url: str, cookie: str, session_id: int, body: dict) -> Reading:
    """The chat path: an open websocket's turn.send -> its token frames (the browser's path, headless); its first
    byte is the turn.queued frame (the submit is stored)."""
    from websockets.sync.client import connect

    url = web_url.replace("http://", "ws://") + f"/ws/chat/{session_id}/"
    arrivals, queued = [], 0.0
    with connect(url, additional_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}",
                                         "Origin": web_url}) as sock:  # fmt: skip
        json.loads(sock.recv(timeout=30))  # the session's snapshot
        params = {"max_tokens": body["max_tokens"], "temperature": body["temperature"], "seed": body["seed"]}
        started = time.perf_counter()
        sock.send(json.dumps({"type": "turn.send", "text": body["messages"][0]["content"], "params": params}))
        while (frame := json.loads(sock.recv(timeout=120)))["type"] != "turn.end":
            if frame["type"] == "turn.queued":
                queued = queued or time.perf_counter()
            if frame["type"] == "token" and frame.get("text"):
                arrivals.append(time.perf_counter())
    return (arrivals[0] - started) * 1000, _rate(arrivals), (queued - started) * 1000


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_streaming_through_v1_against_direct(web_url, celery_worker, rig, model_name, owner, llama_url):
    key = apikeys.api_key_create(owner=owner, name="bench")
    cookie = session_cookie_for(owner)
    body = {"model": model_name, "max_tokens": TOKENS, "temperature": 0.7, "seed": 11, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a story about a fox."}]}  # fmt: skip

    def chat() -> Reading:
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
        return _chat(web_url, cookie, session.pk, body)

    ways = {
        "direct": lambda: _read(f"{llama_url}/v1/chat/completions", body, {}),
        "direct again": lambda: _read(f"{llama_url}/v1/chat/completions", body, {}),
        "/v1": lambda: _read(f"{web_url}/v1/chat/completions", body, {"Authorization": f"Bearer {key.secret}"}),
        "chat": chat,
    }
    names = list(ways)
    for name in names:  # warm: the first request of each kind pays for imports, connections and caches
        ways[name]()
    runs: dict[str, list[Reading]] = {name: [] for name in names}
    for round_ in range(ROUNDS):
        for name in names[round_ % 4 :] + names[: round_ % 4]:
            runs[name].append(ways[name]())
    direct = runs["direct"]
    ttft, rate = statistics.median(d[0] for d in direct), statistics.median(d[1] for d in direct)
    print(f"\nOPENAI {ROUNDS} rounds x {TOKENS} tokens, rotated; direct TTFT p50 {ttft:.1f} ms, {rate:.0f} tok/s")
    for name in ("direct again", "/v1", "chat"):
        added = [r[0] - d[0] for d, r in zip(direct, runs[name], strict=True)]
        ratio = [r[1] / d[1] for d, r in zip(direct, runs[name], strict=True)]
        print(
            f"OPENAI {name:>12}: added TTFT p50 {statistics.median(added):6.1f} ms, p95 {_p(added, 0.95):6.1f} ms; "
            f"decode rate / direct p50 {statistics.median(ratio):.3f} (min {min(ratio):.3f}); "
            f"first byte p50 {statistics.median(r[2] for r in runs[name]):.1f} ms"
        )
