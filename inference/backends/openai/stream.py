"""The OpenAI chat-completions stream (``/v1/chat/completions`` with ``stream``), read for any server that speaks it.

https://platform.openai.com/docs/api-reference/chat-streaming — ``data: {chunk}`` events, ``data: [DONE]`` at the
end. Each server's plug-in gives an ``EventReader`` that turns its events into ``StreamChunk``s (llama-server adds
its timings; a generic server has only ``usage``). Closing the iterator closes the connection, which makes the
server stop decoding the reply.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import orjson

from inference.backends import sse
from inference.backends.base import BackendBadEvent, BackendError, BackendUnavailable, OnSent, ReadGate, StreamChunk

# Keys of the chat body the backend itself sets: a client's field of the same name is not passed (RigDash streams
# every reply and reads its own usage and timings; the model and messages are the turn's).
OWN_KEYS = frozenset({"model", "messages", "stream", "stream_options", "timings_per_token", "max_tokens"})


def passthrough_merged(payload: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` with an API client's other fields added unchanged (``tools``, ``response_format``, ...);
    the backend's own keys (``OWN_KEYS``, and what ``payload`` sets from the turn's settings) win."""
    for name, value in extra.items():
        if name not in OWN_KEYS and name not in payload:
            payload[name] = value
    return payload


def tool_call_deltas(delta: Any, data: str) -> list[dict[str, Any]] | None:
    """``delta.tool_calls`` as the server sent it (a list of objects, each ``function`` an object whose ``name`` and
    ``arguments`` are strings where given), or None; anything else is a bad event, which every API's writer can
    then rely on. A call the model malformed (arguments that are not JSON) is passed on as it came: the client
    reads it."""
    calls = delta.get("tool_calls") if isinstance(delta, dict) else None
    if calls is None:
        return None
    if not isinstance(calls, list) or not all(isinstance(call, dict) and _function_ok(call) for call in calls):
        raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
    return calls or None


def _function_ok(call: dict[str, Any]) -> bool:
    function = call.get("function")
    if function is None:
        return True
    return isinstance(function, dict) and all(
        isinstance(function.get(name), str | None) for name in ("name", "arguments")
    )


def tool_calls_merged(deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A reply's tool calls from their stream deltas: by ``index``, the first ``id``, ``type`` and function
    ``name`` said, the ``arguments`` pieces joined (OpenAI's chat-streaming accumulation)."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        index = delta.get("index", len(calls))
        index = index if isinstance(index, int) else len(calls)
        call = calls.setdefault(index, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
        call["id"] = call["id"] or delta.get("id")
        call["type"] = delta.get("type") or call["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            call["function"]["name"] = call["function"]["name"] or function.get("name")
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]
    return [calls[index] for index in sorted(calls)]


def event_object(data: str) -> dict[str, Any]:
    """One event's data as the JSON object every OpenAI-style server sends; BackendBadEvent otherwise. orjson reads
    RFC 8259 strictly (no NaN, no lone surrogates, 1,024 levels at most), at a quarter of the json module's cost per
    event: this runs once per token."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BackendBadEvent(f"not JSON ({exc}): {data[:200]!r}") from exc
    if not isinstance(event, dict):
        raise BackendBadEvent(f"not an object: {data[:200]!r}")
    return event


class EventReader(Protocol):
    def event(self, data: str, *, last_in_read: bool) -> StreamChunk | None:
        """One event's data (not ``[DONE]``); ``last_in_read``: no later event came in the same read. None: the
        event carries nothing to pass on yet. Raises BackendBadEvent for an event it cannot read."""
        ...

    def done(self) -> StreamChunk | None:
        """At ``[DONE]`` (or the stream's end): a last chunk the reader held back, if any."""
        ...

    @property
    def finished(self) -> bool:
        """A finish reason was passed on."""
        ...


async def stream_chat_events(
    *,
    server: str,
    base_url: str,
    payload: dict[str, Any],
    reader: EventReader,
    error: Callable[[int | None, bytes], BackendError],
    connect_timeout_s: float,
    tls: ssl.SSLContext | None,
    read_gate: ReadGate | None = None,
    on_sent: OnSent | None = None,
    path: str = "/v1/chat/completions",
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[StreamChunk]:
    """POST ``payload`` to ``path`` (``/v1/chat/completions``; ``/v1/completions`` for a raw completion, whose events
    carry ``choices[0].text``) and yield the reader's chunks. ``error`` builds the failure from a
    refusal's status and body. After a read that brought text, ``read_gate`` is awaited with reads paused (the
    worker publishes meanwhile; tokens gather in the socket). No read timeout: the worker enforces first-token and
    stall timeouts."""
    try:
        response = await sse.post_json_stream(
            base_url, path, payload, connect_timeout_s=connect_timeout_s, tls=tls, on_sent=on_sent, headers=headers
        )
    except (OSError, TimeoutError, sse.ProtocolError) as exc:
        raise BackendUnavailable(f"{server} at {base_url} is unreachable: {exc!r}") from exc
    try:
        if response.status != 200:
            try:
                body = await response.read_body()
            except (OSError, sse.ProtocolError):
                body = b""
            raise error(response.status, body)
        done = False
        async for batch in response.event_batches():
            text_seen = False
            last = len(batch) - (2 if batch[-1] == "[DONE]" else 1)
            for index, data in enumerate(batch):
                if data == "[DONE]":
                    done = True
                    break
                chunk = reader.event(data, last_in_read=index >= last)
                if chunk is not None:
                    text_seen = text_seen or chunk.carries
                    yield chunk
            if done:
                break
            if text_seen and read_gate is not None:
                async with response.reads_paused():  # the next tokens gather in the socket meanwhile
                    await read_gate()
        final = reader.done()
        if final is not None:
            yield final
        if not reader.finished:
            raise BackendUnavailable(f"{server} closed the stream before the reply finished")
    except sse.EventError as exc:
        raise BackendBadEvent(str(exc)) from exc
    except (OSError, sse.ProtocolError) as exc:
        raise BackendUnavailable(f"{server} stream failed: {exc!r}") from exc
    finally:
        await response.aclose()
