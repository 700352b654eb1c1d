"""The direct client: a minimal HTTP/1.1 reader of a backend's chat stream, timing each token on arrival.

No library between the socket and the SSE parser, so its figures are what reading the backend costs and
nothing more. Times are ``time.time()`` (shared with the page's clock and the other benchmark processes).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import stats
from bench.sse import ChunkedDecoder, ProtocolError, SSEParser, parse_chat_event, parse_response_head, split_head


@dataclass
class StreamRecord:
    """One reply read straight from the backend: per-token arrival times and texts, and its own timings."""

    t_send: float = 0.0
    times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None
    t_end: float | None = None
    steal_share: float | None = None  # the machine's CPU the hypervisor took while this was read (bench/run.py)
    on_text: Callable[[str], object] | None = field(default=None, repr=False)
    llama_wait_ms_per_s: float | None = None  # llama-server's threads waiting for a core meanwhile (bench/run.py)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def ttft_ms(self) -> float | None:
        return stats.ttft_ms(self.t_send, self.times)

    @property
    def decode_tps(self) -> float | None:
        return stats.decode_rate(self.times)

    @property
    def backend_tps(self) -> float | None:
        value = (self.timings or {}).get("predicted_per_second")
        return float(value) if value is not None else None

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": len(self.times),
            "ttft_ms": self.ttft_ms,
            "decode_tps": self.decode_tps,
            "backend_tps": self.backend_tps,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "steal_share": self.steal_share,
            "llama_wait_ms_per_s": self.llama_wait_ms_per_s,
        }


def chat_payload(*, model: str, prompt: str, max_tokens: int, seed: int, temperature: float = 0.0) -> dict[str, Any]:
    """The same body RigDash's llama.cpp backend sends for a one-message turn (inference/backends/llamacpp/chat.py)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "timings_per_token": True,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
    }


async def direct_chat(
    port: int, payload: dict[str, Any], *, timeout_s: float, on_text: Callable[[str], object] | None = None
) -> StreamRecord:
    """POST /v1/chat/completions on 127.0.0.1:port and read the stream to its end (bounded by timeout_s); ``on_text``
    is given each token's text as it is read (bench/relayfloor.py relays them)."""
    record = StreamRecord(on_text=on_text)
    try:
        await asyncio.wait_for(_read(port, payload, record), timeout_s)
    except TimeoutError:
        record.error = f"timed out after {timeout_s:g} s"
    except (OSError, ProtocolError) as exc:
        record.error = repr(exc)
    record.t_end = time.time()
    return record


async def _read(port: int, payload: dict[str, Any], record: StreamRecord) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    body = json.dumps(payload).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        record.t_send = time.time()
        writer.write(head + body)
        await writer.drain()
        buffer = b""
        while (split := split_head(buffer)) is None:
            chunk = await reader.read(65536)
            if not chunk:
                raise ProtocolError("connection closed before the response head")
            buffer += chunk
        raw_head, rest = split
        response = parse_response_head(raw_head)
        if response.status != 200:
            record.error = f"HTTP {response.status}: {rest[:200]!r}"
            return
        decoder = ChunkedDecoder() if response.chunked else None
        parser = SSEParser()
        data = rest
        while True:
            now = time.time()
            body_bytes = decoder.feed(data) if decoder else data
            for raw in parser.feed(body_bytes):
                event = parse_chat_event(raw)
                if event.error:
                    record.error = event.error
                    return
                if event.done:
                    return
                if event.text:
                    record.times.append(now)
                    record.texts.append(event.text)
                    if record.on_text is not None:
                        record.on_text(event.text)
                if event.finish_reason:
                    record.finish_reason = event.finish_reason
                    record.timings = event.timings
            if decoder and decoder.done:
                return
            data = await reader.read(65536)
            if not data:
                if record.finish_reason is None:
                    record.error = "stream ended before a finish reason"
                return
    finally:
        writer.close()
