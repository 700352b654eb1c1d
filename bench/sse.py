"""Pure parsing for the benchmark's minimal HTTP clients: response heads, chunked bodies, SSE events.

llama-server answers ``/v1/chat/completions`` with ``stream`` as ``Transfer-Encoding: chunked`` server-sent
events: ``data: {json}\\n\\n`` lines, ending with ``data: [DONE]``. The direct client, the recording tap and
the synthetic source all use these pieces, so they read exactly what a client of the backend reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from inference.backends.sse import (  # the same parsing RigDash's worker uses on the hot path
    ChunkedDecoder,
    ProtocolError,
    ResponseHead,
    SSEParser,
    parse_headers,
    parse_response_head,
    split_head,
)

__all__ = [
    "DONE_LINE",
    "LAST_CHUNK",
    "ChatEvent",
    "ChunkedDecoder",
    "ProtocolError",
    "ResponseHead",
    "SSEParser",
    "chat_event_line",
    "encode_chunk",
    "parse_chat_event",
    "parse_request_head",
    "parse_response_head",
    "split_head",
]


def parse_request_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers) of an HTTP/1.1 request head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ProtocolError(f"not an HTTP request line: {lines[0]!r}")
    return parts[0], parts[1], parse_headers(lines[1:])


def encode_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


LAST_CHUNK = b"0\r\n\r\n"


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
    return b"data: " + orjson.dumps(event) + b"\n\n"  # orjson: the source's cost per token is a fifth of json's


DONE_LINE = b"data: [DONE]\n\n"
