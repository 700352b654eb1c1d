"""Shared bits of the benchmark's two tiny HTTP servers (the recording tap and the synthetic source)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.sse import ProtocolError, parse_request_head, split_head

MAX_BODY = 1 << 22


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    raw_head: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


async def read_request(reader: asyncio.StreamReader, timeout_s: float = 30) -> Request | None:
    buffer = b""
    while (split := split_head(buffer)) is None:
        chunk = await asyncio.wait_for(reader.read(65536), timeout_s)
        if not chunk:
            return None
        buffer += chunk
        if len(buffer) > MAX_BODY:
            raise ProtocolError("request head too large")
    head, body = split
    method, target, headers = parse_request_head(head)
    length = int(headers.get("content-length", "0"))
    if length > MAX_BODY:
        raise ProtocolError("request body too large")
    if len(body) < length:
        body += await asyncio.wait_for(reader.readexactly(length - len(body)), timeout_s)
    return Request(method, target, headers, body[:length], head)


def json_response(status: int, payload: Any) -> bytes:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request", 502: "Bad Gateway"}.get(status, "OK")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n"
    ).encode() + body


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


def serve_forever(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], port: int) -> None:
    """Serve on 127.0.0.1:port until SIGTERM/SIGINT; print READY once listening (the parent waits for it)."""

    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", port, backlog=1024, limit=1 << 22)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print("READY", flush=True)
        async with server:
            await stop.wait()

    asyncio.run(main())
