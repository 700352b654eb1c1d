"""A backend request on its way, read by a task of its own from the moment it is sent (``OpenedStream``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, cast

from inference.backends import backend_for
from inference.backends.base import BackendError, BackendNotSupported, ChatRequest, OnSent, StreamChunk
from inference.models import Rig


class ChunkSink(Protocol):
    """What the reader hands its chunks to: a turn's stream (inference/worker/stream.py, ``TurnStream``)."""

    def accept(self, chunk: StreamChunk, now: float) -> None: ...

    async def read_gate(self) -> None: ...


_END = object()


class OpenedStream:
    """A backend request on its way, read by a task of its own (the reader) from the moment it is sent. Chunks read
    before the turn's stream is bound (a ticketed request goes out before its turn is claimed) wait for it here."""

    def __init__(self, rig: Rig, request: ChatRequest, on_sent: OnSent | None) -> None:
        self.state: ChunkSink | None = None
        self.early: list[StreamChunk] = []
        self.sent_by = "claim"  # what sent it: "claim", "ticket" (before its claim) or "early lane" (before its submit)
        backend = backend_for(rig)
        if request.native is not None and not backend.capabilities.native_completions:
            chunks: AsyncIterator[StreamChunk] = _refused(
                BackendNotSupported(f"{backend.label or rig.kind} has no /{request.native} (llama-server's own API)")
            )
        else:
            chunks = backend.stream_chat(request, read_gate=self.gate, on_sent=on_sent)
        if not backend.calls_read_gate:
            chunks = _gathered(chunks, self.gate)
        self.chunks = cast(AsyncGenerator[StreamChunk, None], chunks)
        self.t_request = time.perf_counter()
        self.reader: asyncio.Task[StreamChunk] = asyncio.create_task(self._read())

    async def _read(self) -> StreamChunk:
        """The reader: every chunk goes to the turn's stream (batches go out at the read gate); returns the one with
        the finish reason."""
        async for chunk in self.chunks:
            if self.state is None:
                self.early.append(chunk)
            else:
                self.state.accept(chunk, time.perf_counter())
            if chunk.finish_reason:
                return chunk
        raise BackendError("the backend ended the stream without a finish reason")

    async def gate(self) -> None:
        """The plug-in's read gate: the turn's, once bound; until then reads go through at once."""
        if self.state is not None:
            await self.state.read_gate()

    def bind(self, state: ChunkSink) -> None:
        """From now on the reader hands its chunks to ``state``, beginning with those it kept."""
        now = time.perf_counter()
        for chunk in self.early:
            state.accept(chunk, now)
        self.early.clear()
        self.state = state

    async def close(self) -> None:
        """Close the HTTP stream: the backend stops working on this request."""
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.chunks.aclose()


async def _refused(why: BackendError) -> AsyncIterator[StreamChunk]:
    raise why
    yield  # an async generator that sends nothing


async def _gathered(
    chunks: AsyncIterator[StreamChunk], gate: Callable[[], Awaitable[None]]
) -> AsyncIterator[StreamChunk]:
    """A plug-in that does not call the read gate (the ollama client reads its stream itself) is read into a queue
    on a task of its own: what came in together is handed on together, then the gate is awaited, as after a read
    of the socket. That costs a task switch per batch, which the llama.cpp plug-in saves."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for chunk in chunks:
                queue.put_nowait(chunk)
            queue.put_nowait(_END)
        except Exception as exc:
            queue.put_nowait(exc)

    task = asyncio.create_task(pump())
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            text = False
            for item in items:
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                text = text or bool(item.text)
                yield item
            if text:
                await gate()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await cast(AsyncGenerator[StreamChunk, None], chunks).aclose()


def open_stream(rig: Rig, request: ChatRequest, *, on_sent: OnSent | None = None) -> OpenedStream:
    """Send the backend request (on the running loop) and start reading its stream. ``on_sent``: called once the
    request is written (the backend plug-in's ``stream_chat``)."""
    return OpenedStream(rig, request, on_sent)
