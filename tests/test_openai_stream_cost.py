"""What streaming through /v1/chat/completions adds to reading llama-server directly, beside what the chat's websocket
adds (a measurement, not a timed test: ``RIGDASH_BENCH_OPENAI=1 ./scripts/test tests/test_openai_stream_cost.py -s``;
figures in docs/benchmarks.md). Same definitions as the benchmark (/work/shared/reference/performance.md): TTFT =
request sent -> first text; decode rate = (n - 1) / (t_last - t_first), n counted in the backend's chunks with text
(a token each) on every path: RigDash sends them coalesced, several to a batch, so its n is the turn's seq count
(``output_events``: a chat frame's ``seq_to``; for /v1/, whose chunks carry no seq, the stored turn's), and the first
batch is one chunk (the worker publishes the first token at once).

Each round reads the same seeded 96-token reply five ways, in a rotating order so that drift on a shared machine hits
all alike: llama-server directly (twice: the second read against the first is what this machine's noise alone
"adds"), through a bare relay (``bench/httprelay.py``: the floor of any gateway in front of the backend, what a
request's extra hop costs with no RigDash), through RigDash's /v1/, and through the chat's websocket. The target
(issue 54) is /v1/'s added TTFT within 5 ms of the relay's.

Every way sends over a connection it opened before its clock starts, as the chat's page does (its socket is open) and
as the official ``openai`` client does (one keep-alive pool per client). ``RIGDASH_BENCH_FRESH_CONNECTIONS=1`` gives
the HTTP ways a new client and connection per reply instead: building an ``httpx`` client (its TLS context) then
falls inside the HTTP ways' TTFT, direct and /v1/ alike, but never the chat's, which skews the comparison."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings

from inference.board import apikeys
from inference.models import ChatSession, Rig, Turn
from rigdash.launcher import Stack, free_port, wait_http
from tests.conftest import LOG_DIR, TEST_QUEUE_2, session_cookie_for

pytestmark = [
    pytest.mark.skipif(not os.environ.get("RIGDASH_BENCH_OPENAI"), reason="set RIGDASH_BENCH_OPENAI=1"),
    pytest.mark.llama,
    pytest.mark.django_db(transaction=True),
]
ROUNDS, TOKENS = int(os.environ.get("RIGDASH_BENCH_ROUNDS", "12")), 96
FRESH = bool(os.environ.get("RIGDASH_BENCH_FRESH_CONNECTIONS"))
SYNTHETIC_TTFT_MS = int(os.environ.get("RIGDASH_BENCH_SYNTHETIC_TTFT_MS", "0"))
Reading = tuple[float, float, float]  # TTFT ms, decode tokens/s, first byte of the answer ms (submit done)


def _rate(arrivals: list[float], chunks: int | None = None) -> float:
    """Decode rate from the arrivals of the pieces with text, which hold ``chunks`` backend chunks in all (one each
    when None)."""
    assert len(arrivals) > 10
    return ((chunks or len(arrivals)) - 1) / (arrivals[-1] - arrivals[0])


def _read(client: httpx.Client | None, url: str, body: dict, headers: dict, chunks: Any = None) -> Reading:
    """One streamed reply over ``client``'s open connection, or a new client's; ``chunks()``: how many backend chunks
    its pieces held (one each when None)."""
    started, arrivals, first_byte = time.perf_counter(), [], 0.0
    streaming = httpx.stream if client is None else client.stream
    with streaming("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            first_byte = first_byte or time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and (event["choices"][0].get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
    return (arrivals[0] - started) * 1000, _rate(arrivals, chunks and chunks()), (first_byte - started) * 1000


def _chat(web_url: str, cookie: str, session_id: int, body: dict) -> Reading:
    """The chat path: an open websocket's turn.send -> its token frames (the browser's path, headless); its first
    byte is the turn.queued frame (the submit is stored)."""
    from websockets.sync.client import connect

    url = web_url.replace("http://", "ws://") + f"/ws/chat/{session_id}/"
    arrivals, queued, seq, first = [], 0.0, 0, 0
    with connect(url, additional_headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}",
                                         "Origin": web_url}) as sock:  # fmt: skip
        json.loads(sock.recv(timeout=30))  # the session's snapshot
        params = {name: body[name] for name in ("max_tokens", "temperature", "seed") if name in body}
        started = time.perf_counter()
        sock.send(json.dumps({"type": "turn.send", "text": body["messages"][0]["content"], "params": params}))
        while (frame := json.loads(sock.recv(timeout=120)))["type"] != "turn.end":
            if frame["type"] == "turn.queued":
                queued = queued or time.perf_counter()
            if frame["type"] == "token" and frame.get("text"):
                arrivals.append(time.perf_counter())
                seq, first = frame["seq_to"], first if arrivals[1:] else frame["seq_to"]
    # The first frame's chunks arrived at t_first: (n - 1) counts the chunks after the first one's.
    return (arrivals[0] - started) * 1000, _rate(arrivals, seq - first + 1), (queued - started) * 1000


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@pytest.fixture
def relay_url(llama_url: str) -> Iterator[str]:
    """The bare relay (bench/httprelay.py) in front of the test's llama-server."""
    port, processes = free_port(), Stack()
    upstream = llama_url.rsplit(":", 1)[1]
    command = [sys.executable, "-m", "bench.httprelay", "--port", str(port), "--upstream-port", upstream]
    proc = processes.start("relay", command, log_path=LOG_DIR / "relay.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop()


def test_streaming_through_v1_against_direct(web_url, celery_worker, rig, model_name, owner, llama_url, relay_url):
    body = {"model": model_name, "max_tokens": TOKENS, "temperature": 0.7, "seed": 11, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a story about a fox."}]}  # fmt: skip
    _measure(web_url, rig, owner, llama_url, relay_url, body)


@pytest.mark.skipif(not SYNTHETIC_TTFT_MS, reason="set RIGDASH_BENCH_SYNTHETIC_TTFT_MS (e.g. 40)")
def test_streaming_through_v1_against_a_backend_that_reads_prompts_off_the_cpu(web_url, celery_worker, owner):
    """The same five ways against the synthetic llama-server (bench/synthetic.py) in the place of a GPU rig: its
    first token comes ``RIGDASH_BENCH_SYNTHETIC_TTFT_MS`` after the request, the prompt read on no CPU of this
    machine, so what RigDash adds is measured without the backend competing for the two cores (the early lane's
    case: docs/streaming.md, step 1a)."""
    processes = Stack()
    port, relay_port = free_port(), free_port()
    try:
        synthetic = processes.start("synthetic", [sys.executable, "-m", "bench.synthetic", "--port", str(port),
                                                  "--slots", "2"], log_path=LOG_DIR / "synthetic.log")  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30, proc=synthetic)
        relay = processes.start("relay-synthetic", [sys.executable, "-m", "bench.httprelay", "--port",
                                                    str(relay_port), "--upstream-port", str(port)],
                                log_path=LOG_DIR / "relay-synthetic.log")  # fmt: skip
        wait_http(f"http://127.0.0.1:{relay_port}/health", timeout_s=30, proc=relay)
        rig = Rig.objects.create(name="gpu-like", kind=Rig.Kind.LLAMACPP, base_url=f"http://127.0.0.1:{port}",
                                 queue=TEST_QUEUE_2, slots=2)  # fmt: skip
        directive = f"[synthetic rate=60 tokens={TOKENS} ttft={SYNTHETIC_TTFT_MS}]"
        body = {"model": "synthetic", "max_tokens": TOKENS, "stream": True,
                "messages": [{"role": "user", "content": f"Tell me a story about a fox. {directive}"}]}  # fmt: skip
        _measure(web_url, rig, owner, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{relay_port}", body)
    finally:
        processes.stop()


def _measure(web_url: str, rig: Rig, owner: Any, llama_url: str, relay_url: str, body: dict[str, Any]) -> None:
    """Read ``body``'s reply the five ways for ``ROUNDS`` rounds and print what each adds over reading directly."""
    key = apikeys.api_key_create(owner=owner, name="bench")
    cookie = session_cookie_for(owner)
    model_name = body["model"]

    def chat() -> Reading:
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
        return _chat(web_url, cookie, session.pk, body)

    bearer = {"Authorization": f"Bearer {key.secret}"}

    def api_chunks() -> int:
        return int(Turn.objects.filter(session__api_key=key.key).latest("id").stats["output_events"])

    clients = {name: None if FRESH else httpx.Client() for name in ("direct", "direct again", "relay", "/v1")}
    ways = {
        "direct": lambda: _read(clients["direct"], f"{llama_url}/v1/chat/completions", body, {}),
        "direct again": lambda: _read(clients["direct again"], f"{llama_url}/v1/chat/completions", body, {}),
        "relay": lambda: _read(clients["relay"], f"{relay_url}/v1/chat/completions", body, {}),
        "/v1": lambda: _read(clients["/v1"], f"{web_url}/v1/chat/completions", body, bearer, api_chunks),
        "chat": chat,
    }
    names = list(ways)
    for name in names:  # warm: the first request of each kind pays for imports, connections and caches
        ways[name]()
    runs: dict[str, list[Reading]] = {name: [] for name in names}
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            runs[name].append(ways[name]())
    direct = runs["direct"]
    ttft, rate = statistics.median(d[0] for d in direct), statistics.median(d[1] for d in direct)
    how = "a new HTTP connection per reply" if FRESH else "open connections"
    print(f"\nOPENAI {ROUNDS} rounds x {TOKENS} tokens, {how}; direct TTFT p50 {ttft:.1f} ms, {rate:.0f} tok/s")
    for client in clients.values():
        if client is not None:
            client.close()
    added_by = {name: [r[0] - d[0] for d, r in zip(direct, runs[name], strict=True)] for name in names[1:]}
    for name in names[1:]:
        added = added_by[name]
        ratio = [r[1] / d[1] for d, r in zip(direct, runs[name], strict=True)]
        print(
            f"OPENAI {name:>12}: added TTFT p50 {statistics.median(added):6.1f} ms, p95 {_p(added, 0.95):6.1f} ms; "
            f"decode rate / direct p50 {statistics.median(ratio):.3f} (min {min(ratio):.3f}); "
            f"first byte p50 {statistics.median(r[2] for r in runs[name]):.1f} ms"
        )
    over = [v - r for v, r in zip(added_by["/v1"], added_by["relay"], strict=True)]
    print(f"OPENAI /v1 over the bare relay: added TTFT p50 {statistics.median(over):.1f} ms (target <= 5)")
    sent_by = Counter(t.stats.get("request_sent_by") for t in Turn.objects.filter(session__api_key=key.key))
    print(f"OPENAI /v1 requests sent by: {dict(sent_by)}")  # the early lane's share (docs/streaming.md, step 1a)
