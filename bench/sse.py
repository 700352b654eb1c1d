"""Pure parsing for the benchmark's minimal HTTP clients: response heads, chunked bodies, SSE events.

llama-server answers ``/v1/chat/completions`` with ``stream`` as ``Transfer-Encoding: chunked`` server-sent
events: ``data: {json}\\n\\n`` lines, ending with ``data: [DONE]``. The direct client, the recording tap and
the synthetic source all use these pieces, so they read exactly what a client of the backend reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class ProtocolError(Exception):
    pass


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()


def split_head(buffer: bytes) -> tuple[bytes, bytes] | None:
    """(head, rest) once ``buffer`` holds a whole HTTP head ending in a blank line; None before that."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    return buffer[:end], buffer[end + 4 :]


def parse_response_head(head: bytes) -> ResponseHead:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP status line: {lines[0]!r}")
    return ResponseHead(status=int(parts[1]), headers=parse_headers(lines[1:]))


def parse_request_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers) of an HTTP/1.1 request head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ProtocolError(f"not an HTTP request line: {lines[0]!r}")
    return parts[0], parts[1], parse_headers(lines[1:])


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


@dataclass
class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder: feed raw bytes, get body bytes back."""

    done: bool = False
    _buffer: bytearray = field(default_factory=bytearray)
    _remaining: int = 0  # body bytes left in the current chunk
    _need_crlf: bool = False  # a chunk's trailing CRLF is still to come

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        while not self.done:
            if self._remaining:
                take = min(self._remaining, len(self._buffer))
                if not take:
                    break
                out += self._buffer[:take]
                del self._buffer[:take]
                self._remaining -= take
                if self._remaining == 0:
                    self._need_crlf = True
                continue
            if self._need_crlf:
                if len(self._buffer) < 2:
                    break
                if self._buffer[:2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                del self._buffer[:2]
                self._need_crlf = False
                continue
            end = self._buffer.find(b"\r\n")
            if end < 0:
                break
            size_text = bytes(self._buffer[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise ProtocolError(f"bad chunk size {size_text!r}") from exc
            del self._buffer[: end + 2]
            if size == 0:
                self.done = True  # trailers, if any, are ignored
                break
            self._remaining = size
        return bytes(out)


def encode_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


LAST_CHUNK = b"0\r\n\r\n"


@dataclass
class SSEParser:
    """Incremental server-sent-events parser: feed body bytes, get the ``data`` of each complete event."""

    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return events
            block = bytes(self._buffer[:end]).decode("utf-8")
            del self._buffer[: end + 2]
            lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
            if lines:
                events.append("\n".join(lines))


@dataclass(frozen=True)
class ChatEvent:
    """One event of an OpenAI-style chat stream as llama-server sends it."""

    text: str
    finish_reason: str | None
    timings: dict[str, Any] | None
    done: bool = False  # the [DONE] sentinel
    error: str | None = None


def parse_chat_event(data: str) -> ChatEvent:
    if data == "[DONE]":
        return ChatEvent(text="", finish_reason=None, timings=None, done=True)
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"malformed event {data[:120]!r}") from exc
    if "error" in event:
        return ChatEvent(text="", finish_reason=None, timings=None, error=str(event["error"]))
    choice = (event.get("choices") or [{}])[0]
    text = (choice.get("delta") or {}).get("content") or ""
    return ChatEvent(text=text, finish_reason=choice.get("finish_reason"), timings=event.get("timings"))


def chat_event_line(
    *,
    text: str | None,
    finish_reason: str | None = None,
    timings: dict[str, Any] | None = None,
    model: str = "synthetic",
) -> bytes:
    """One ``data:`` event in llama-server's format (used by the synthetic source)."""
    delta: dict[str, Any] = {} if text is None else {"content": text}
    event: dict[str, Any] = {
        "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
        "model": model,
        "object": "chat.completion.chunk",
    }
    if timings is not None:
        event["timings"] = timings
    return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE_LINE = b"data: [DONE]\n\n"
