"""The OpenAI chat-completions stream (``/v1/chat/completions`` with ``stream``), read for any server that speaks it.

https://platform.openai.com/docs/api-reference/chat-streaming — ``data: {chunk}`` events, ``data: [DONE]`` at the
end. Each server's plug-in gives an ``EventReader`` that turns its events into ``StreamChunk``s (llama-server adds
its timings; a generic server has only ``usage``). Closing the iterator closes the connection, which makes the
server stop decoding the reply.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from inference.backends import sse
from inference.backends.base import BackendBadEvent, BackendError, BackendUnavailable, OnSent, ReadGate, StreamChunk


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
) -> AsyncIterator[StreamChunk]:
    """POST ``payload`` to ``/v1/chat/completions`` and yield the reader's chunks. ``error`` builds the failure from a
    refusal's status and body. After a read that brought text, ``read_gate`` is awaited with reads paused (the
    worker publishes meanwhile; tokens gather in the socket). No read timeout: the worker enforces first-token and
    stall timeouts."""
    try:
        response = await sse.post_json_stream(
            base_url, "/v1/chat/completions", payload, connect_timeout_s=connect_timeout_s, tls=tls, on_sent=on_sent
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
                    text_seen = text_seen or bool(chunk.text or chunk.thinking)
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
