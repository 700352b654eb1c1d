"""Stream one chat turn from the backend, coalesce tokens, publish batches, store the end (its start, the claim and
the request, is inference/starts.py).

The contract (docs/streaming.md): a token is published at once when the last batch went out at least one
interval ago (so the first one always is); otherwise it goes in the batch due one interval after the last one:
at most one batch per interval, and no token waits longer than the interval. The interval is the worker's
``FlushPace``: short while a turn streams alone, longer as more stream at once, never over
RIGDASH_FLUSH_INTERVAL_MS. Every
batch carries the turn id and seq_from..seq_to (one seq per backend chunk with text, usually one token).
Each batch is appended to the turn's Redis live list before it is published. The database is written when
the turn is claimed, at its first token, at checkpoints every few seconds, and once at the end.

Two tasks per turn: the reader reads the backend's stream and publishes the batches itself, at the plug-in's read
gate (after each read that brought text); the turn's own task watches it every CANCEL_CHECK_S for the cancel
flag, the timeouts and the checkpoints. A batch is one wake-up of one task (docs/benchmarks.md): before
2026-12-01 a pump task read the stream into a queue and a consumer task waited on the queue with a timeout,
two task switches and a timer on every batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
from channels.db import database_sync_to_async as db_async
from django.conf import settings
from django.db import DatabaseError, connection
from redis.exceptions import RedisError

from inference import board, events, live, quotas, services
from inference.backends import backend_for
from inference.backends.base import BackendError, BackendStats, ChatRequest, OnSent, StreamChunk
from inference.models import Rig, Turn
from inference.redislink import RedisLink
from rigdash import cpushare
from rigdash.env import RigDashConfig

log = logging.getLogger(__name__)
_END = object()
CANCEL_CHECK_S = 0.1  # a Stop is seen within this (plus one flush); reading the flag with every batch cost 1 op in 3
# The turn's task reads the flag itself only when no batch has for this long. At CANCEL_CHECK_S it woke in step with
# the batches' reads and read first about two times in three: round trips of its own on a flowing stream.
WATCH_CANCEL_S = 1.5 * CANCEL_CHECK_S
# A batch due within this goes now: the backend's next read is let through this much before the batch is due, so
# that read and flush share one wake-up (see TurnStream.read_gate).
FLUSH_SLACK_S = 0.002
REDIS_RETRY_S = 0.25  # while Redis is unreachable, a flush is tried this often
RECENT_GAPS = 4  # the read gate goes by the mean of this many latest gaps between tokens


class TurnCancelled(Exception):
    pass


class TurnTimeout(Exception):
    pass


@dataclass
class StreamMeter:
    """Client-side timings of one reply (perf_counter seconds); see ../shared performance definitions."""

    t_request: float
    t_first: float | None = None
    t_last: float | None = None
    events: int = 0
    gaps_ms: list[float] = field(default_factory=list)

    def token(self, now: float) -> None:
        if self.t_first is None:
            self.t_first = now
        elif self.t_last is not None:
            self.gaps_ms.append(round((now - self.t_last) * 1000, 3))
        self.t_last = now
        self.events += 1

    @property
    def ttft_ms(self) -> float | None:
        return None if self.t_first is None else round((self.t_first - self.t_request) * 1000, 2)

    @property
    def decode_tps(self) -> float | None:
        """(n - 1) / (t_last - t_first): decode rate without the prompt phase."""
        if self.events < 2 or self.t_first is None or self.t_last is None or self.t_last <= self.t_first:
            return None
        return round((self.events - 1) / (self.t_last - self.t_first), 2)

    def live_stats(self) -> dict[str, Any]:
        return {"tokens": self.events, "ttft_ms": self.ttft_ms, "decode_tps": self.decode_tps}

    def final_stats(self, backend: BackendStats | None) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "ttft_ms": self.ttft_ms,
            "decode_tps": self.decode_tps,
            "output_events": self.events,
            "output_tokens": self.events,
            "inter_token_gaps_ms": self.gaps_ms,
            "e2e_ms": round(((self.t_last or self.t_request) - self.t_request) * 1000, 2),
        }
        if backend is not None:
            stats.update(
                {
                    "prompt_tokens": backend.prompt_tokens,
                    "prompt_ms": backend.prompt_ms,
                    "cached_tokens": backend.cached_tokens,
                    "backend_decode_tps": backend.decode_tps,
                    "backend_timings": backend.raw,
                }
            )
            if backend.output_tokens is not None:
                stats["output_tokens"] = backend.output_tokens
        return stats


class FlushPace:
    """How long a token may wait for its batch, shared by the turns streaming on one worker loop.

    A turn alone gets ``min_s``: its page can show a token at the browser's next frame, where a 33 ms batch
    adds 16 ms on average (display lag p50 29 ms at 33 ms, 16 ms at 10 ms: docs/benchmarks.md). Each other turn
    streaming on the loop adds half of ``min_s``, up to ``max_s`` (10, 15, 20, 25 ms for one to four turns, the
    ceiling from six): the batches the worker publishes per second, and the frames the web writes for them, stay
    under 2 / ``min_s`` until every turn is at the ceiling. Adding a whole ``min_s`` per turn kept them near
    1 / ``min_s``, but four turns of 30-34 tok/s then got 33 ms and their tokens waited for it: display lag
    p50 23 ms at level 2 against 14 ms at 25 ms (docs/benchmarks-history.md, "A fast AMD EPYC").
    A turn counts from its backend request to its end, so one still reading its prompt counts too: it is
    about to stream, and when sixteen turns start together (the benchmark's level 3) the first to get tokens
    do not publish at the short interval while the rest are still in their prompts (counting only from the
    first token was not measured)."""

    def __init__(self, min_s: float, max_s: float, on_change: Callable[[int], None] | None = None) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.streaming = 0
        self.on_change = on_change  # told each step of the count (the CPU split's signal: rigdash/cpushare.py)

    def _count(self, step: int) -> None:
        self.streaming += step
        if self.on_change is not None:
            self.on_change(step)

    def interval(self) -> float:
        return min(self.max_s, self.min_s * (max(1, self.streaming) + 1) / 2)

    @contextlib.contextmanager
    def streaming_turn(self) -> Iterator[None]:
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)


# Per event loop, keyed by the loop itself: an id can be reused by a later loop once the first is collected (tests
# run a loop per test), and a client or a pace belongs to the loop it was made on.
_paces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FlushPace] = weakref.WeakKeyDictionary()


def _pace_for_loop() -> FlushPace:
    """The pace of the turns on this event loop (the worker runs them all on one: inference.aio)."""
    loop = asyncio.get_running_loop()
    conf = settings.RIGDASH
    min_s, max_s = conf.flush_min_interval_ms / 1000, conf.flush_interval_ms / 1000  # the settings keep min <= max
    pace = _paces.get(loop)
    if pace is None or (pace.min_s, pace.max_s) != (min_s, max_s):  # new settings (tests override them)
        pace = _paces[loop] = FlushPace(min_s, max_s, on_change=cpushare.worker_signal().streams)
    return pace


@dataclass
class TurnStream:
    """The state of one streaming turn inside the worker's event loop."""

    turn: Turn
    redis: aioredis.Redis  # the board's progress
    link: RedisLink  # the batches' writes (inference/redislink.py)
    meter: StreamMeter
    pace: FlushPace
    parts: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    pending_since: float | None = None
    last_sent: float = float("-inf")  # when the last batch with text was published
    seq_sent: int = 0
    last_checkpoint: float = 0.0
    cancelled: bool = False
    cancel_checked_at: float = float("-inf")
    context_tokens: int | None = None  # in the sequence's context now (the backend's count)
    context_window: int | None = None  # the context one sequence gets on this rig (a slot's n_ctx)
    # Admin board progress (throttled) and the user's context quota, checked against the backend's prompt_n.
    progress: board.ProgressReporter | None = None  # set once started, beside the backend request
    context_quota: int | None = None
    backend_prompt_tokens: int | None = None  # the backend's count of the prompt, once it sent it
    prompt_state: PromptState | None = None  # settled before the first batch goes out
    live_broken: bool = False  # a flush failed to reach Redis: the live list must be rebuilt when it is back
    live_entries: int = 0  # entries the live list should hold now (checked against each RPUSH's reply)
    redis_retry_at: float = float("-inf")  # after a failed flush, the next try waits until then (no busy loop)
    last_read_at: float = 0.0  # when the backend last sent a chunk (the stall timeouts count from it)
    stop: Exception | None = None  # the watchdog ends the turn (a cancel, a timeout): the reader raises it
    decoding: asyncio.Task[None] | None = None  # the first token's database write and the sampler's wake-up
    publishing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one batch at a time goes out

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def flush_interval_s(self) -> float:
        return self.pace.interval()

    def flush_due(self) -> float | None:
        """When the pending tokens go out: at once if the last batch is an interval old, else an interval after it."""
        if self.pending_since is None:
            return None
        return max(self.pending_since, self.last_sent + self.flush_interval_s, self.redis_retry_at)

    async def flush(self) -> None:
        """Append the pending batch to the live list, read the cancel flag (at most every CANCEL_CHECK_S, in the
        same round trip), then publish the batch."""
        text = "".join(self.pending) if self.pending else ""
        taken = len(self.pending)  # tokens the reader accepts while this batch is on its way wait for the next one
        seq_from, seq_to = self.seq_sent + 1, self.meter.events
        now = time.perf_counter()
        check_cancel = now - self.cancel_checked_at >= CANCEL_CHECK_S
        if seq_from == 1 and text and self.prompt_state is not None:
            await self.prompt_state.settle()  # a 'prompt' state that went out reaches the page before any token
        message = publication = None
        stats: dict[str, Any] = {}
        if text:
            stats = self.live_stats()
            message = events.token_batch_message(
                turn_id=self.turn.pk, seq_from=seq_from, seq_to=seq_to, text=text, stats=stats
            )
            publication = events.pubsub_publication(events.session_group(self.turn.session_id), message)
        rebuilding = bool(text) and self.live_broken
        progress = self._progress_due(text)
        progress_commands = None if progress is None else board.progress_commands(progress)
        if text or check_cancel:
            # One round trip: append to the live list, then publish (Redis runs them in order, so a snapshot
            # read after the publish holds the batch), the board's progress when it is due (twice a second), and
            # the cancel flag when it is due.
            try:
                async with self.link.pipeline() as pipe:
                    if text:
                        self._append_live(pipe, seq_from, seq_to, text, stats, rewrite=rebuilding)
                        if publication is not None:
                            pipe.publish(*publication)
                    for command in progress_commands or ():
                        pipe.command(*command)
                    if check_cancel:
                        pipe.get(live.cancel_key(self.turn.pk))
                    results = await pipe.execute()
            except (RedisError, OSError) as exc:
                # Redis is down or restarting: keep decoding and keep the batch pending (the database still gets
                # checkpoints and the end). The next flush that gets through rebuilds the live list whole.
                self._redis_away(exc)
                return
            if check_cancel:
                self.cancel_checked_at = now
                self.cancelled = self.cancelled or bool(results[-1])
        if text:
            self.live_broken = False
            self.live_entries = 1 if rebuilding else self.live_entries + 1
            if results[1 if rebuilding else 0] != self.live_entries:
                # The list lost entries without any command failing: Redis restarted between two flushes and the
                # client reconnected on its own. Rebuild it whole now, or a page that resyncs would miss them.
                await self._rebuild_live(seq_to, stats)
            del self.pending[:taken]
            self.seq_sent = seq_to
            self.last_sent = time.perf_counter()
            self.pending_since = self.last_sent if self.pending else None
            if message is not None and publication is None:  # another channel layer: its own group_send
                await events.group_send(events.session_group(self.turn.session_id), message)
            if progress is not None and progress_commands is None:  # another channel layer: two round trips
                with contextlib.suppress(RedisError, OSError):  # the board's progress is a view: the next tick retries
                    await board.send_progress(self.redis, progress)

    def _progress_due(self, text: str) -> dict[str, Any] | None:
        """The board's progress to send with this batch, when it has text and the progress is due."""
        if not text or self.progress is None or not self.progress.due():
            return None
        return self.progress.take(tokens=self.meter.events, decode_tps=self.meter.decode_tps, status="decoding")

    def _append_live(
        self, pipe: Any, seq_from: int, seq_to: int, text: str, stats: dict[str, Any], *, rewrite: bool
    ) -> None:
        """Append a batch to the turn's live list; with ``rewrite`` (Redis came back empty, or without what was
        appended while it was away), replace the list with one batch holding the whole reply so far, so that a
        snapshot is always seq 1..n."""
        key = live.live_key(self.turn.pk)
        if rewrite:  # a failed pipeline may have run part-way: rewrite rather than append
            pipe.delete(key)
            pipe.rpush(key, live.encode_batch(1, seq_to, "".join(self.parts[:seq_to]), stats))
        else:
            pipe.rpush(key, live.encode_batch(seq_from, seq_to, text, stats))
        if seq_from == 1 or rewrite:
            pipe.expire(key, live.LIVE_TTL_S)

    async def _rebuild_live(self, seq_to: int, stats: dict[str, Any]) -> None:
        log.warning("turn %s: the live list lost entries (Redis restarted?); rebuilding it", self.turn.pk)
        try:
            async with self.link.pipeline() as pipe:
                self._append_live(pipe, 1, seq_to, "", stats, rewrite=True)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._redis_away(exc)  # the next flush with text rewrites it
            return
        self.live_entries = 1

    def _redis_away(self, exc: Exception) -> None:
        """Redis did not answer: the live list must be rewritten whole once it does, and the next try waits."""
        if not self.live_broken:
            log.warning("turn %s: Redis unavailable while streaming (%r); holding tokens", self.turn.pk, exc)
        self.live_broken = True
        self.redis_retry_at = time.perf_counter() + REDIS_RETRY_S

    async def read_gate(self) -> None:
        """Given to the backend: called after a read that brought text, before the next read. This is where batches
        go out: the pending tokens once due (at once when the last batch is an interval old), and the first token
        at once. Then the next read waits until the next batch could go out (just before): tokens wait in the
        kernel meanwhile, which costs no CPU; read one by one they woke the worker per token. Holding them there
        instead of in ``pending`` changes no latency: the interval between batches is the same."""
        if self.pending:
            delay = cast(float, self.flush_due()) - FLUSH_SLACK_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.publish()
        # Until the next batch is due (flush_due counts from the end of the last batch too): a read then finds the
        # tokens that came meanwhile and they go out at once, with no second wait before their batch. Not when
        # tokens come slower than batches may go: the next one would come after the batch is due anyway, so the
        # read waits for it and it goes out as it comes. The wait would only add a wake-up to every token (a timer
        # that fires before the token is there): 7 % of the worker's CPU on a 35 tok/s stream (docs/benchmarks.md).
        delay = self.last_sent + self.flush_interval_s - FLUSH_SLACK_S - time.perf_counter()
        if delay > 0 and self.tokens_outpace_batches():
            await asyncio.sleep(delay)

    def tokens_outpace_batches(self) -> bool:
        """Whether the last few tokens came faster than one a flush interval, as read (until there are gaps to
        go by, assume they do). Tokens read together count as they were read, so a stream held at the gate
        measures as fast as it is read, and one that is not held measures as it comes."""
        recent = self.meter.gaps_ms[-RECENT_GAPS:]
        return not recent or sum(recent) < len(recent) * self.flush_interval_s * 1000

    async def publish(self) -> None:
        """Send the pending batch (one at a time: the turn's task sends the tokens read before the turn was
        claimed); after the first token, mark the turn decoding beside the stream. Raises the watchdog's reason
        to stop once the batch is out: a batch is never cut off half sent."""
        async with self.publishing:
            if self.pending:
                await self.flush()
                if self.seq_sent and self.decoding is None:  # the first batch that went out
                    self.decoding = asyncio.create_task(_decoding(self))
        if self.stop is None and self.cancelled:  # the batch read the flag
            self.stop = TurnCancelled()
        if self.stop is not None:
            raise self.stop

    async def check_cancel(self) -> None:
        """Read the cancel flag (the watchdog, when no batch has read it for WATCH_CANCEL_S)."""
        now = time.perf_counter()
        try:
            [flag] = await self.link.execute([("GET", live.cancel_key(self.turn.pk))])
        except (RedisError, OSError) as exc:
            self._redis_away(exc)
            return
        self.cancel_checked_at = now
        self.cancelled = self.cancelled or bool(flag)

    def live_stats(self) -> dict[str, Any]:
        return {**self.meter.live_stats(), "context_tokens": self.context_tokens, "context_limit": self.context_window}

    def accept(self, chunk: StreamChunk, now: float) -> None:
        self.last_read_at = now
        if chunk.context_tokens is not None:
            self.context_tokens = chunk.context_tokens
        if chunk.stats is not None and chunk.stats.prompt_tokens is not None:
            in_context = chunk.stats.prompt_tokens + (chunk.stats.cached_tokens or 0)  # prompt_n excludes the cache
            self.backend_prompt_tokens = in_context
            if self.progress is not None:
                self.progress.backend_prompt(in_context)
            quotas.context_check(prompt_tokens=in_context, limit=self.context_quota, estimated=False)
        if not chunk.text:
            return
        self.meter.token(now)
        self.parts.append(chunk.text)
        self.pending.append(chunk.text)
        if self.pending_since is None:
            self.pending_since = now


async def _start_progress(state: TurnStream, messages: list[dict[str, str]]) -> None:
    """The board's progress for this turn, and the slot's context window for the live stats."""
    try:
        progress = await board.progress_start(state.turn, messages, state.redis)
    except Exception:  # the board is a view of the turn, never a reason to fail it
        log.exception("turn %s: board progress could not start", state.turn.pk)
        return
    if progress.prompt_estimated and state.backend_prompt_tokens is not None:
        progress.backend_prompt(state.backend_prompt_tokens)
    state.progress, state.context_window = progress, progress.n_ctx


async def _decoding(state: TurnStream) -> None:
    """The first token is out: the turn is decoding, and the monitoring sampler, which reads an idle rig less often,
    hears of it and samples the rig at once. Not sooner: a sample while the backend reads the prompt would take a
    core from it, on the turn's time to first token."""
    try:
        await db_async(gated(services.turn_mark_decoding))(turn_id=state.turn.pk)
    except DatabaseError as exc:  # a view of the phase: the pages have the tokens, and the end is stored whole
        log.warning("turn %s: could not mark it decoding: %r", state.turn.pk, exc)
    try:
        await events.rig_decoding(rig_id=state.turn.session.rig_id)
    except Exception as exc:  # without it the sampler still finds the turn at its next idle tick
        log.warning("turn %s: could not wake the monitoring sampler: %r", state.turn.pk, exc)


class OpenedStream:
    """A backend request on its way, read by a task of its own (the reader) from the moment it is sent. Chunks read
    before the turn's stream is bound (a ticketed request goes out before its turn is claimed) wait for it here."""

    def __init__(self, rig: Rig, request: ChatRequest, on_sent: OnSent | None) -> None:
        self.state: TurnStream | None = None
        self.early: list[StreamChunk] = []
        backend = backend_for(rig)
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

    def bind(self, state: TurnStream) -> None:
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


async def stream_turn(
    turn: Turn,
    request: ChatRequest,
    redis_client: aioredis.Redis,
    *,
    context_quota: int | None = None,
    prompt_state: PromptState | None = None,
    opened: OpenedStream | None = None,
) -> services.TurnOutcome:
    """Stream one reply. The backend request goes out first (or went out already: ``opened``); the board's
    progress reporter (which may need the slot's context from the backend) starts beside it. ``prompt_state`` is
    settled before the first batch, so a 'prompt' state that went out reaches the page before any token."""
    conf = settings.RIGDASH
    if opened is None:
        opened = open_stream(turn.session.rig, request)
    state = TurnStream(
        turn=turn,
        redis=redis_client,
        link=link_for_loop(),
        meter=StreamMeter(t_request=opened.t_request),
        pace=_pace_for_loop(),
        context_quota=context_quota,
        prompt_state=prompt_state,
    )
    state.last_checkpoint = state.last_read_at = state.meter.t_request
    reporter = asyncio.create_task(_start_progress(state, request.messages))
    final: StreamChunk | None = None
    status, error, finish_reason = Turn.Status.DONE, "", ""
    try:
        with state.pace.streaming_turn():
            opened.bind(state)
            if state.pending:  # read before the turn was claimed: out at once
                await state.publish()
            final = await _watch(state, opened.reader, conf)
        finish_reason = final.finish_reason or "stop"
    except TurnCancelled:
        status, finish_reason = Turn.Status.CANCELLED, "cancelled"
    except TurnTimeout as exc:
        status, finish_reason, error = Turn.Status.FAILED, "timeout", str(exc)
    except quotas.QuotaExceeded as exc:  # the backend's prompt_n is over the user's context limit
        status, finish_reason, error = Turn.Status.FAILED, exc.code, exc.message
    except BackendError as exc:
        status, finish_reason, error = Turn.Status.FAILED, exc.code, str(exc)
    finally:
        await opened.close()  # the backend stops decoding this reply
        await asyncio.gather(reporter, return_exceptions=True)
        if state.decoding is not None:  # also when this task is cancelled: no write left running without an owner
            await asyncio.gather(state.decoding, return_exceptions=True)
    if state.pending:
        await state.flush()
    if state.decoding is not None:
        await state.decoding
    return services.TurnOutcome(
        status=status,
        reply_text=state.text,
        finish_reason=finish_reason,
        stats={
            **state.meter.final_stats(final.stats if final else None),
            "context_tokens": state.context_tokens,
            "context_limit": state.context_window,
        },
        error=error,
    )


async def _watch(state: TurnStream, reader: asyncio.Task[StreamChunk], conf: RigDashConfig) -> StreamChunk:
    """Wait for the reader to end the reply. Every CANCEL_CHECK_S meanwhile: the cancel flag (when no batch has read
    it for WATCH_CANCEL_S: a Stop is seen within 0.2 s either way), the first-token and stall timeouts, and a
    checkpoint of the reply when one is due."""
    while True:
        await asyncio.wait((reader,), timeout=CANCEL_CHECK_S)
        if reader.done():
            return reader.result()  # the finish, or what ended the stream (a cancel seen by a batch among them)
        now = time.perf_counter()
        if now - state.cancel_checked_at >= WATCH_CANCEL_S:
            await state.check_cancel()
        if state.cancelled:
            await _stop(state, reader, TurnCancelled())
        limit = conf.first_token_timeout_s if state.meter.events == 0 else conf.stall_timeout_s
        if now - state.last_read_at > limit:
            phase = "the first token" if state.meter.events == 0 else "the next token"
            await _stop(
                state, reader, TurnTimeout(f"The backend sent nothing for {limit:g} s while waiting for {phase}.")
            )
        if now - state.last_checkpoint >= conf.checkpoint_interval_s:
            state.last_checkpoint = now
            try:
                await db_async(gated(services.turn_checkpoint))(turn_id=state.turn.pk, reply_text=state.text)
            except DatabaseError as exc:
                # What a checkpoint is for (the text a dead worker leaves behind) is not worth the reply: the turn
                # streams on, and the next checkpoint, or the end, stores the text.
                log.warning("turn %s: checkpoint failed, streaming on: %r", state.turn.pk, exc)


async def _stop(state: TurnStream, reader: asyncio.Task[StreamChunk], reason: Exception) -> NoReturn:
    """End the turn for ``reason``: a reader sending a batch raises it once the batch is out (a batch cut off half
    sent would leave the live list and the pages unsure of what went out); any other reader is cancelled."""
    state.stop = reason
    if not state.publishing.locked():
        reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    raise reason


_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = weakref.WeakKeyDictionary()
_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RedisLink] = weakref.WeakKeyDictionary()


def redis_for_loop() -> aioredis.Redis:
    """The running loop's Redis client, for the board's progress (a batch's writes go through ``link_for_loop``)."""
    loop = asyncio.get_running_loop()
    client = _redis_clients.get(loop)
    if client is None:
        client = _redis_clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL)
    return client


def link_for_loop() -> RedisLink:
    """The running loop's connection for batch writes (the worker runs every turn on one loop: inference.aio)."""
    loop = asyncio.get_running_loop()
    link = _links.get(loop)
    if link is None:
        link = _links[loop] = RedisLink(settings.REDIS_URL)
    return link


# SQLite lets one connection write at a time, and a connection that finds the lock taken sleeps in SQLite's busy
# handler, 1, 2, 5, 10 ... up to 100 ms between tries, however soon the lock is free again. When sixteen turns
# started at once (the benchmark's level 3), their task threads waited up to 650 ms for claims that take 2 ms.
# So this process's own writes queue on a lock, which hands over at once; SQLite's handler is left to arbitrate
# only between processes. Other databases lock rows, and their writes go ungated.
_write_lock = threading.Lock()
_ungated = contextlib.nullcontext()


def _gate() -> threading.Lock | contextlib.nullcontext[None]:
    return _write_lock if connection.vendor == "sqlite" else _ungated


P = ParamSpec("P")
R = TypeVar("R")


def gated(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, run under this process's write gate (see ``_gate``)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with _gate():
            return fn(*args, **kwargs)

    return run


class PromptState:
    """A turn's 'prompt' state for its page, sent only when the prompt outlasts ``delay_s`` (a flush interval).

    A page takes a turn's first token as the end of its prompt phase. When the first token comes sooner, the
    state would only flash by; and when sixteen turns started together it doubled the frames the web had to
    write to every watching socket at once (docs/benchmarks.md, level 3). A long prompt, the case the state
    is for, still shows it after one interval."""

    def __init__(self, turn: Turn, delay_s: float) -> None:
        self._turn = turn
        self._sending = False
        self._task = asyncio.create_task(self._send_after(delay_s))

    async def _send_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self._sending = True
        await events.turn_state(session_id=self._turn.session_id, turn_id=self._turn.pk, status=Turn.Status.PROMPT)

    async def settle(self) -> None:
        """Before the first batch and before the end: drop the state if it has not begun to go out, else wait
        until it has (a failed send is dropped too: the page sees the turn's tokens or its end instead)."""
        if not self._sending:
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
