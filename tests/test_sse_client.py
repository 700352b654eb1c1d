"""The worker's lean HTTP/SSE client (inference/backends/sse.py) against a real local socket server.

The server is a few lines of asyncio that answer with bytes each test chooses: split anywhere, chunked or
not, cut short. The llama.cpp backend's behaviour on top of it is tested against a real llama-server in
test_llamacpp_backend.py and test_backend_conformance.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from inference.backends import sse
from inference.backends.base import BackendError, BackendUnavailable, ChatRequest
from inference.backends.llamacpp import LlamaCppBackend


@asynccontextmanager
async def serve(parts: list[bytes], *, delay_s: float = 0.0) -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTP server on 127.0.0.1 that reads one request and writes ``parts`` one by one, then closes."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
        length = int(lengths[0].split(b":")[1]) if lengths else 0  # a GET has no body
        requests.append(head + await reader.readexactly(length))
        for part in parts:
            writer.write(part)
            await writer.drain()
            if delay_s:
                await asyncio.sleep(delay_s)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        server.close()
        await server.wait_closed()


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [b'data: {"n": 1, "t": "h\xc3\xa9"}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]


async def read_events(base_url: str, path: str = "/v1/x") -> list[str]:
    response = await sse.post_json_stream(base_url, path, {"q": "é"}, connect_timeout_s=2)
    try:
        assert response.status == 200
        return [data async for batch in response.event_batches() for data in batch]
    finally:
        await response.aclose()


async def test_chunked_events_split_at_every_byte_arrive_whole_and_in_order():
    wire = HEAD_CHUNKED + chunked(*EVENTS)
    async with serve([wire[i : i + 1] for i in range(len(wire))]) as (url, requests):
        events = await read_events(url)
    assert events == ['{"n": 1, "t": "hé"}', '{"n": 2}', "[DONE]"]  # a two-byte UTF-8 character split too
    head, body = requests[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/x HTTP/1.1\r\n") and json.loads(body) == {"q": "é"}


async def test_one_chunk_may_hold_several_events_and_one_event_several_chunks():
    joined = b"".join(EVENTS)
    async with serve([HEAD_CHUNKED + chunked(joined[:5], joined[5:40], joined[40:])]) as (url, _):
        assert await read_events(url) == ['{"n": 1, "t": "hé"}', '{"n": 2}', "[DONE]"]


async def test_content_length_and_close_delimited_bodies():
    body = b"".join(EVENTS)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    async with serve([head, body + b"data: trailing junk past the length\n\n"]) as (url, _):
        assert await read_events(url) == ['{"n": 1, "t": "hé"}', '{"n": 2}', "[DONE]"]
    async with serve([b"HTTP/1.1 200 OK\r\n\r\n", body]) as (url, _):  # no length: the body ends at close
        assert await read_events(url) == ['{"n": 1, "t": "hé"}', '{"n": 2}', "[DONE]"]


async def test_a_base_url_path_prefix_is_kept():
    async with serve([HEAD_CHUNKED + chunked(*EVENTS)]) as (url, requests):
        await read_events(url + "/llama/", "/v1/chat/completions")
    assert requests[0].startswith(b"POST /llama/v1/chat/completions HTTP/1.1\r\n")


async def test_a_stream_cut_inside_a_chunk_is_a_protocol_error():
    async with serve([HEAD_CHUNKED + b"40\r\ndata: {"]) as (url, _):
        with pytest.raises(sse.ProtocolError):
            await read_events(url)


async def test_garbage_instead_of_http_is_a_protocol_error():
    async with serve([b"SSH-2.0-OpenSSH\r\n\r\n"]) as (url, _):
        with pytest.raises(sse.ProtocolError):
            await read_events(url)


async def test_unreachable_server_and_bad_url():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(OSError):
        await sse.post_json_stream(f"http://127.0.0.1:{port}", "/", {}, connect_timeout_s=2)
    with pytest.raises(sse.ProtocolError):
        await sse.post_json_stream("ftp://example.invalid", "/", {}, connect_timeout_s=2)


async def _backend_chunks(url: str) -> list[object]:
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return [chunk async for chunk in LlamaCppBackend(url).stream_chat(request)]


async def test_llamacpp_backend_maps_error_answers_and_cut_streams():
    body = json.dumps({"error": {"code": 400, "message": "the request exceeds the context"}}).encode()
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    async with serve([head, body]) as (url, _):
        with pytest.raises(BackendError, match="answered 400: the request exceeds the context") as caught:
            await _backend_chunks(url)
        assert not isinstance(caught.value, BackendUnavailable)  # a 4xx is the request's fault, not retryable
    async with serve([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nloading"]) as (url, _):
        with pytest.raises(BackendUnavailable, match="503"):
            await _backend_chunks(url)
    event = b'data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
    async with serve([HEAD_CHUNKED + chunked(event)[:-5]]) as (url, _):  # no last chunk: the server died
        with pytest.raises(BackendUnavailable):
            await _backend_chunks(url)


async def test_a_read_gate_gathers_tokens_in_the_socket_without_delaying_the_first():
    """After a read that brought text the backend awaits the caller's gate (here 30 ms) before reading again:
    20 tokens sent 5 ms apart arrive in a handful of reads, and the first is read at once."""
    role = b'data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
    tokens = [b'data: {"choices":[{"delta":{"content":"t%d "},"finish_reason":null}]}\n\n' % i for i in range(20)]
    end = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    parts = [HEAD_CHUNKED + chunked(role)[:-5], *(chunked(t)[:-5] for t in tokens), chunked(end)]
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=20)

    async def gate() -> None:
        await asyncio.sleep(0.03)

    async with serve(parts, delay_s=0.005) as (url, _):
        loop = asyncio.get_running_loop()
        start = loop.time()
        arrivals = [(loop.time(), c) async for c in LlamaCppBackend(url).stream_chat(request, read_gate=gate)]
    texts = [c.text for _, c in arrivals if c.text]
    assert texts == [f"t{i} " for i in range(20)] and arrivals[-1][1].finish_reason == "stop"
    first_text_at = next(t for t, c in arrivals if c.text)
    assert first_text_at - start < 0.025  # sent about 5-10 ms in: not held back
    reads = 1 + sum(1 for (a, _), (b, _) in itertools.pairwise(arrivals) if b - a > 0.002)
    assert reads <= 10  # about 100 ms of tokens in reads 30 ms apart; one read per token would be 20


async def test_an_event_that_never_ends_is_refused_before_it_fills_memory():
    parser = sse.SSEParser(max_event_bytes=1000)
    assert parser.feed(b"data: " + b"x" * 500) == []
    with pytest.raises(sse.ProtocolError, match="longer than 1000 bytes"):
        parser.feed(b"x" * 600)


async def test_get_reads_a_whole_body_of_either_framing_with_its_status():
    """The sampler's reads of llama-server (/slots, /metrics, /props) every second."""
    body = b'[{"id": 0, "n_ctx": 2304}]'
    async with serve([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body), body[:5], body[5:]]) as (url, seen):
        assert await sse.get(url + "/prefix", "/slots", timeout_s=2) == (200, body)
    assert seen[0].startswith(b"GET /prefix/slots HTTP/1.1\r\n") and b"Connection: close" in seen[0]
    async with serve([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunked(body[:7], body[7:])]) as (
        url,
        _,
    ):
        assert await sse.get(url, "/slots", timeout_s=2) == (200, body)
    async with serve([b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 7\r\n\r\nno slot"]) as (url, _):
        assert await sse.get(url, "/slots", timeout_s=2) == (501, b"no slot")


async def test_get_refuses_an_oversized_body_and_gives_up_on_a_silent_server():
    async with serve([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"x" * 100]) as (url, _):
        with pytest.raises(sse.ProtocolError, match="more than 64 bytes"):
            await sse.get(url, "/metrics", timeout_s=2, limit=64)
    async with serve([b"HTTP/1.1 200 OK\r\n"], delay_s=5) as (url, _):  # the head never ends
        with pytest.raises(TimeoutError):
            await sse.get(url, "/slots", timeout_s=0.3)


async def test_the_llama_cpp_collector_names_each_failed_read():
    """What the sampler shows: a refused connection is the backend unreachable (Unavailable); a non-200 answer or an
    answer that is not JSON is that endpoint's own missing panel (``refused``), the server itself being up."""
    from inference.backends.llamacpp import metrics as llamacpp
    from monitoring.collectors import Unavailable

    with pytest.raises(Unavailable, match="unreachable"):
        await llamacpp.collect("http://127.0.0.1:9", props_cache={"x": 1}, metrics_cache={})
    async with serve([b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n"]) as (url, _):
        reading = await llamacpp.collect(url, props_cache={"x": 1}, metrics_cache={})
        assert "/slots answered 501" in reading.refused["slots"] and reading.slots == []
    async with serve([b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n<h1>"]) as (url, _):
        reading = await llamacpp.collect(url, props_cache={"x": 1}, metrics_cache={})
        assert "not JSON" in reading.refused["slots"]
