"""A lean HTTP/1.1 client for one server-sent-events stream: the hot path of every llama.cpp turn.

Why not httpx here: reading a chat stream token by token through httpx's ``aiter_lines`` (httpcore, anyio,
h11, a line decoder) costs a large share of the worker's CPU per token (docs/changelog.md). This module reads
the socket with asyncio streams, decodes ``Transfer-Encoding: chunked`` and splits events itself: a few
``bytes.find`` calls per token. It is used for the streaming POST and for the monitoring sampler's reads of
llama-server every second (``get``: httpx's request machinery was half the sampler's CPU while idle);
everything else (health, models, props from the backend) stays on httpx.

What it supports is what a chat stream needs: ``http`` and ``https`` base URLs (with a path prefix), a JSON
body, a chunked, ``Content-Length`` or close-delimited response, and a clear error for anything else. One
connection per request, ``Connection: close``: closing it is how the backend learns to stop decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

READ_SIZE = 65536
MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_EVENT_BYTES = 1 << 20  # llama-server's events are a few hundred bytes (a few KB with n_probs)
MAX_GET_BODY_BYTES = 8 << 20  # /slots, /metrics and /props are a few KB to a few hundred KB


class ProtocolError(Exception):
    """The server sent something that is not the HTTP or SSE this client reads."""


class EventError(ProtocolError):
    """An event in valid SSE framing whose bytes cannot be read (not UTF-8)."""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isascii() and value.isdigit() else None


def split_head(buffer: bytes | bytearray) -> tuple[bytes, bytes] | None:
    """(head, rest) once ``buffer`` holds a whole HTTP head ending in a blank line; None before that."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    return bytes(buffer[:end]), bytes(buffer[end + 4 :])


def parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line: {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def parse_response_head(head: bytes) -> ResponseHead:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not (parts[1].isascii() and parts[1].isdigit()):
        raise ProtocolError(f"not an HTTP status line: {lines[0]!r}")
    return ResponseHead(status=int(parts[1]), headers=parse_headers(lines[1:]))


@dataclass
class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder: feed raw bytes, get body bytes back."""

    done: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _remaining: int = 0  # body bytes left in the current chunk
    _need_crlf: bool = False  # a chunk's trailing CRLF is still to come

    def feed(self, data: bytes) -> bytes:
        # One pass over the buffer with a position, and one deletion at the end: a chat stream sends each event in
        # a chunk of its own, so this runs once per token.
        buffer = self._buffer
        buffer += data
        out: list[bytearray] = []
        pos, size_of = 0, len(buffer)
        while not self.done:
            if self._remaining:
                take = min(self._remaining, size_of - pos)
                if not take:
                    break
                out.append(buffer[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._need_crlf = True
                continue
            if self._need_crlf:
                if size_of - pos < 2:
                    break
                if buffer[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._need_crlf = False
                continue
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                if size_of - pos > 1024:
                    raise ProtocolError("chunk size line too long")
                break
            size_text = bytes(buffer[pos:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise ProtocolError(f"bad chunk size {size_text!r}") from exc
            if size < 0:
                raise ProtocolError(f"bad chunk size {size_text!r}")
            pos = end + 2
            if size == 0:
                self.done = True  # trailers, if any, are ignored
                break
            self._remaining = size
        del buffer[:pos]
        return b"".join(out)


@dataclass
class SSEParser:
    """Incremental server-sent-events parser: feed body bytes, get the ``data`` of each complete event.

    Events end with a blank line (``\\n\\n``; ``\\r\\n`` line ends are normalised). Only ``data:`` fields
    are kept; a multi-line data field is joined with newlines, as the SSE standard says.
    """

    _buffer: bytearray = field(default_factory=bytearray)
    max_event_bytes: int = MAX_EVENT_BYTES
    error: EventError | None = None  # an unreadable event: raised once the events before it are handed on

    def feed(self, data: bytes) -> list[str]:
        if self.error is not None:
            raise self.error
        self._buffer += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                if len(self._buffer) > self.max_event_bytes:  # a server that never ends an event cannot fill memory
                    raise ProtocolError(f"an event longer than {self.max_event_bytes} bytes")
                return events
            raw = bytes(self._buffer[:end])
            del self._buffer[: end + 2]
            try:
                block = raw.decode("utf-8")
            except UnicodeDecodeError:
                self.error = EventError(f"an event that is not UTF-8: {raw[:100]!r}")
                if not events:
                    raise self.error from None
                return events
            if block.startswith("data: ") and "\n" not in block:  # the common case: one data line
                events.append(block[6:])
                continue
            lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
            if lines:
                events.append("\n".join(lines))


@dataclass
class SSEResponse:
    """An open response: its status and headers, then either ``event_batches()`` or ``read_body()``."""

    head: ResponseHead
    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    _rest: bytes

    @property
    def status(self) -> int:
        return self.head.status

    async def _body_parts(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, de-chunked; ends at the body's end."""
        if self.head.chunked:
            decoder = ChunkedDecoder()
            data = self._rest
            while True:
                if data:
                    out = decoder.feed(data)
                    if out:
                        yield out
                if decoder.done:
                    return
                data = await self._reader.read(READ_SIZE)
                if not data:
                    raise ProtocolError("the connection closed inside a chunked body")
        remaining = self.head.content_length
        data = self._rest
        while True:
            if remaining is not None:
                data = data[:remaining]
                remaining -= len(data)
            if data:
                yield data
            if remaining == 0:
                return
            data = await self._reader.read(READ_SIZE)
            if not data:
                if remaining:
                    raise ProtocolError("the connection closed before the body's Content-Length")
                return

    async def event_batches(self) -> AsyncIterator[list[str]]:
        """The ``data`` of each event, in order, until the body ends: one list per read from the socket, of the
        events it completed (reads that complete none yield nothing)."""
        parser = SSEParser()
        async for part in self._body_parts():
            if batch := parser.feed(part):
                yield batch
            if parser.error is not None:
                raise parser.error

    @contextlib.asynccontextmanager
    async def reads_paused(self) -> AsyncIterator[None]:
        """Read nothing from the socket inside this block: what the server sends meanwhile waits in the kernel's
        buffer and is read in one wake-up afterwards, instead of one wake-up per token."""
        transport = cast(asyncio.Transport, self._writer.transport)  # a socket transport: it reads too
        transport.pause_reading()
        try:
            yield
        finally:
            if not transport.is_closing():
                transport.resume_reading()

    async def read_body(self, limit: int = MAX_ERROR_BODY_BYTES, *, strict: bool = False) -> bytes:
        """The whole body, cut at ``limit`` bytes (an error answer), or with ``strict`` refused past it (a body
        that will be parsed: a cut one would only fail later, less clearly)."""
        body = bytearray()
        async for part in self._body_parts():
            body += part
            if len(body) > limit and strict:
                raise ProtocolError(f"the answer has more than {limit} bytes")
            if len(body) >= limit and not strict:
                break
        return bytes(body[:limit])

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):  # already reset by the peer: closed either way
            await self._writer.wait_closed()


async def post_json_stream(
    base_url: str,
    path: str,
    payload: dict[str, Any],
    *,
    connect_timeout_s: float,
    tls: ssl.SSLContext | None = None,
    accept: str = "text/event-stream",
    on_sent: Callable[[], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> SSEResponse:
    """POST ``payload`` as JSON to ``base_url + path`` and return once the response head has arrived.

    ``connect_timeout_s`` bounds the connect and the send, not the wait for the head (llama-server sends it
    once the prompt is processed). ``on_sent`` is called once the request is written, before that wait. Raises
    OSError, TimeoutError or ProtocolError.
    """
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return await _open(
        "POST", base_url, path, body, accept=accept, connect_timeout_s=connect_timeout_s, tls=tls, on_sent=on_sent,
        headers=headers,
    )  # fmt: skip


async def get(
    base_url: str,
    path: str,
    *,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
    limit: int = MAX_GET_BODY_BYTES,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    """GET ``base_url + path``: the status and the whole body, all within ``timeout_s``. Raises OSError,
    TimeoutError, or ProtocolError (also for a body over ``limit`` bytes, rather than a cut one)."""
    async with asyncio.timeout(timeout_s):
        response = await _open(
            "GET", base_url, path, None, accept="*/*", connect_timeout_s=timeout_s, tls=tls, headers=headers
        )
        try:
            return response.status, await response.read_body(limit, strict=True)
        finally:
            await response.aclose()


def _header_value(value: str) -> str:
    """A header value as written on the wire: a line break in it would end the header (and start another)."""
    if "\r" in value or "\n" in value:
        raise ProtocolError("a header value with a line break")
    return value


async def _open(
    method: str,
    base_url: str,
    path: str,
    body: bytes | None,
    *,
    accept: str,
    connect_timeout_s: float,
    tls: ssl.SSLContext | None,
    on_sent: Callable[[], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> SSEResponse:
    url = urlsplit(base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ProtocolError(f"not an http(s) URL: {base_url!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    host_header = url.hostname if url.port is None else f"{url.hostname}:{url.port}"
    if ":" in url.hostname and url.port is None:
        host_header = f"[{url.hostname}]"
    elif ":" in url.hostname:
        host_header = f"[{url.hostname}]:{url.port}"
    target = (url.path.rstrip("/") + path) or "/"
    content = "" if body is None else f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    extra = "".join(f"{name}: {_header_value(value)}\r\n" for name, value in (headers or {}).items())
    request = (
        f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n{content}{extra}"
        f"Accept: {accept}\r\nConnection: close\r\nUser-Agent: rigdash\r\n\r\n"
    ).encode("latin-1") + (body or b"")

    async with asyncio.timeout(connect_timeout_s):
        reader, writer = await asyncio.open_connection(
            url.hostname, port, ssl=tls if url.scheme == "https" else None, limit=1 << 20
        )
    try:
        async with asyncio.timeout(connect_timeout_s):
            writer.write(request)
            await writer.drain()
        if on_sent is not None:
            on_sent()
        # No limit on the wait for the head: llama-server answers once the prompt is processed, which can
        # take long; the caller's first-token timeout covers it.
        buffer = bytearray()
        while (split := split_head(buffer)) is None:
            data = await reader.read(READ_SIZE)
            if not data:
                raise ProtocolError("the connection closed before the response head")
            buffer += data
            if len(buffer) > MAX_HEAD_BYTES:
                raise ProtocolError("the response head is too large")
        raw_head, rest = split
        return SSEResponse(head=parse_response_head(raw_head), _reader=reader, _writer=writer, _rest=rest)
    except BaseException:
        writer.close()
        raise
