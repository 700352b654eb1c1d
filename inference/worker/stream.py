"""Stream one chat turn from the backend: coalesce tokens into batches, publish them, watch for a cancel, a timeout
or a checkpoint, and return its outcome (the start, the claim and the request, is inference/worker/start.py).

The contract (docs/streaming.md): a token is published at once when the last batch went out at least one
interval ago (so the first one always is); otherwise it goes in the batch at the worker loop's first flush tick after
the last batch was due: a flowing stream's batches are an interval apart, on the ticks every turn on the loop shares
(so their batches share a Redis round trip), and no token waits longer than the interval. The interval is the
worker's ``FlushPace`` (inference/worker/pace.py). Every batch carries the turn id and seq_from..seq_to (one seq per
backend chunk with text, usually one token) and is appended to the turn's live list before it is published, in one
Redis round trip. The database is written when the turn is claimed, at its first
token, at checkpoints every few seconds, and once at the end.

Two tasks per turn: the reader (inference/worker/reader.py) reads the backend's stream and publishes the batches
itself, at the plug-in's read gate (after each read that brought text); the turn's own task watches it every
CANCEL_CHECK_S for the cancel flag, the timeouts and the checkpoints, so a batch costs one wake-up of one task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import redis.asyncio as aioredis
from channels.db import database_sync_to_async as db_async
from django.conf import settings
from django.db import DatabaseError
from redis.exceptions import RedisError

from inference import events
from inference.backends.base import BackendError, BackendRefused, ChatRequest, StreamChunk, user_message
from inference.backends.openai.stream import tool_calls_merged
from inference.db import gated
from inference.errors import QuotaExceeded
from inference.live import progress as live_progress
from inference.live import state
from inference.live.link import RedisLink
from inference.live.progress import ProgressReporter
from inference.live.state import LiveList
from inference.models import Rig, Turn
from inference.queue import quotas
from inference.tokens import estimate_prompt_tokens, history_truncated
from inference.turns import lifecycle
from inference.worker.loading import first_answer_limit_s, model_needs_load
from inference.worker.loop import link_for_loop
from inference.worker.pace import TICK_EPSILON_S, FlushPace, StreamMeter, pace_for_loop
from inference.worker.prompt import PromptState
from inference.worker.reader import OpenedStream, open_stream
from rigdash.env import RigDashConfig

log = logging.getLogger(__name__)
CANCEL_CHECK_S = 0.1  # a Stop is seen within this (plus one flush); the flag is read at most this often


# The turn's task reads the flag itself only when no batch has for this long. At CANCEL_CHECK_S it woke in step with
# the batches' reads and read first about two times in three: round trips of its own on a flowing stream.
WATCH_CANCEL_S = 1.5 * CANCEL_CHECK_S


# A batch due within this goes now: the backend's next read is let through this much before the batch is due, so
# that read and flush share one wake-up (see TurnStream.read_gate).
FLUSH_SLACK_S = 0.002


RECENT_GAPS = 4  # the read gate goes by the mean of this many latest gaps between tokens


class TurnCancelled(Exception):
    pass


class TurnTimeout(Exception):
    pass


@dataclass
class TurnStream:
    """The state of one streaming turn inside the worker's event loop."""

    turn: Turn
    redis: aioredis.Redis  # the board's progress
    link: RedisLink  # the batches' writes (inference/live/link.py)
    meter: StreamMeter
    pace: FlushPace
    parts: list[str] = field(default_factory=list)  # the answer's text per seq
    pending: list[str] = field(default_factory=list)
    # A reasoning model's thoughts per seq, beside ``parts`` and ``pending`` (one entry per seq in each, "" when a
    # chunk brought none): thinking is its own part of the turn, in the same batches and seqs as the answer.
    thoughts: list[str] = field(default_factory=list)
    pending_thoughts: list[str] = field(default_factory=list)
    # An API client's tool-call deltas and logprobs (OpenAI's shapes), in the batch that carries them and, whole,
    # in the turn's stats at its end; none for a chat page's turn.
    tool_call_deltas: list[dict[str, Any]] = field(default_factory=list)
    pending_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    pending_logprobs: list[Any] = field(default_factory=list)
    pending_since: float | None = None
    last_sent: float = float("-inf")  # when the last batch with text was published
    last_due: float = float("-inf")  # when it was due (a flush tick, or its first token's arrival when at once)
    seq_sent: int = 0
    last_checkpoint: float = 0.0
    cancelled: bool = False
    cancel_checked_at: float = float("-inf")
    context_tokens: int | None = None  # in the sequence's context now (the backend's count)
    context_window: int | None = None  # the context one sequence gets on this rig (a slot's n_ctx)
    # Admin board progress (throttled) and the user's context quota, checked against the backend's prompt_n.
    progress: ProgressReporter | None = None  # set once started, beside the backend request
    context_quota: int | None = None
    backend_prompt_tokens: int | None = None  # the backend's count of the prompt, once it sent it
    prompt_state: PromptState | None = None  # settled before the first batch goes out
    loading: bool = False  # the server is loading the model before the prompt (_check_loading)
    last_read_at: float = 0.0  # when the backend last sent a chunk (the stall timeouts count from it)
    stop: Exception | None = None  # the watchdog ends the turn (a cancel, a timeout): the reader raises it
    decoding: asyncio.Task[None] | None = None  # the first token's database write and the sampler's wake-up
    publishing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one batch at a time goes out
    _live: LiveList | None = field(default=None, init=False, repr=False)

    @property
    def live(self) -> LiveList:
        """The turn's live list: its appends, and its repair after Redis lost it."""
        turn_id = self.turn.pk if self.turn is not None else 0
        if self._live is None or self._live.turn_id != turn_id:
            self._live = LiveList(turn_id)
        return self._live

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def thinking(self) -> str:
        return "".join(self.thoughts)

    @property
    def flush_interval_s(self) -> float:
        return self.pace.interval()

    def flush_due(self) -> float | None:
        """When the pending tokens go out: at once if the last batch is an interval old, else at the next slot."""
        if self.pending_since is None:
            return None
        if self.pending_since >= self.last_sent + self.flush_interval_s:
            due = self.pending_since
        else:
            due = max(self.pending_since, self.next_slot())
        return max(due, self.live.retry_at)

    def next_slot(self) -> float:
        """The loop's first flush tick after the last batch was due: a flowing stream's batches are an interval
        apart, on the same ticks as every other turn's on the loop. A batch that went out at once, off the ticks,
        is followed by one at the next tick, so no token waits longer than an interval, and a turn has at most two
        batches an interval."""
        if self.last_due == float("-inf"):  # nothing sent yet (or Redis took none): no slot to wait for
            return self.last_due
        return self.pace.next_tick(self.last_due + TICK_EPSILON_S)

    async def flush(self) -> None:
        """Append the pending batch to the live list, read the cancel flag (at most every CANCEL_CHECK_S, in the
        same round trip), then publish the batch."""
        taken = len(self.pending)  # tokens the reader accepts while this batch is on its way wait for the next one
        calls_taken, logprobs_taken = len(self.pending_tool_calls), len(self.pending_logprobs)
        due = self.flush_due()
        text, thinking = "".join(self.pending), "".join(self.pending_thoughts[:taken])
        seq_from, seq_to = self.seq_sent + 1, self.meter.events
        now = time.perf_counter()
        check_cancel = now - self.cancel_checked_at >= CANCEL_CHECK_S
        if seq_from == 1 and taken and self.prompt_state is not None:
            await self.prompt_state.settle()  # a 'prompt' state that went out reaches the page before any token
        message = publication = None
        stats: dict[str, Any] = {}
        if taken:
            stats = self.live_stats()
            message = events.token_batch_message(
                turn_id=self.turn.pk, seq_from=seq_from, seq_to=seq_to, text=text, stats=stats, thinking=thinking,
                tool_calls=self.pending_tool_calls[:calls_taken], logprobs=self.pending_logprobs[:logprobs_taken],
            )  # fmt: skip
            publication = events.pubsub_publication(events.session_group(self.turn.session_id), message)
        rebuilding = bool(taken) and self.live.broken
        pushed_at = 0  # where the RPUSH reply is among the round trip's replies
        progress = self._progress_due(bool(taken))
        progress_commands = None if progress is None else live_progress.progress_commands(progress)
        if taken or check_cancel:
            # One round trip: append to the live list, then publish (Redis runs them in order, so a snapshot
            # read after the publish holds the batch), the board's progress when it is due (twice a second), and
            # the cancel flag when it is due.
            try:
                async with self.link.pipeline() as pipe:
                    if taken:
                        pushed_at = self.live.append(
                            pipe,
                            seq_from,
                            seq_to,
                            text,
                            stats,
                            parts=self.parts,
                            thinking=thinking,
                            thoughts=self.thoughts,
                        )
                        if publication is not None:
                            pipe.publish(*publication)
                    for command in progress_commands or ():
                        pipe.command(*command)
                    if check_cancel:
                        pipe.get(state.cancel_key(self.turn.pk))
                    results = await pipe.execute()
            except (RedisError, OSError) as exc:
                # Redis is down or restarting: keep decoding and keep the batch pending (the database still gets
                # checkpoints and the end). The next flush that gets through rebuilds the live list whole.
                self.live.away(exc)
                return
            if check_cancel:
                self.cancel_checked_at = now
                self.cancelled = self.cancelled or bool(results[-1])
        if taken:
            if not self.live.appended(results[pushed_at], rebuilt=rebuilding):
                await self.live.rebuild(self.link, seq_to, stats, parts=self.parts, thoughts=self.thoughts)
            del self.pending[:taken]
            del self.pending_thoughts[:taken]
            del self.pending_tool_calls[:calls_taken]
            del self.pending_logprobs[:logprobs_taken]
            self.seq_sent = seq_to
            self.last_sent = time.perf_counter()
            # A batch at a tick went out up to a slack's time before it; one that went at once, or late, went now.
            self.last_due = max(due, now) if due is not None else now
            self.pending_since = self.last_sent if self.pending else None
            if message is not None and publication is None:  # another channel layer: its own group_send
                await events.group_send(events.session_group(self.turn.session_id), message)
            if progress is not None and progress_commands is None:  # another channel layer: two round trips
                with contextlib.suppress(RedisError, OSError):  # the board's progress is a view: the next tick retries
                    await live_progress.send_progress(self.redis, progress)

    def _progress_due(self, batch: bool) -> dict[str, Any] | None:
        """The board's progress to send with this batch, when it has tokens and the progress is due."""
        if not batch or self.progress is None or not self.progress.due():
            return None
        return self.progress.take(tokens=self.meter.events, decode_tps=self.meter.decode_tps, status="decoding")

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
        # that fires before the token is there).
        delay = self.next_slot() - FLUSH_SLACK_S - time.perf_counter()
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
            [flag] = await self.link.execute([("GET", state.cancel_key(self.turn.pk))])
        except (RedisError, OSError) as exc:
            self.live.away(exc)
            return
        self.cancel_checked_at = now
        self.cancelled = self.cancelled or bool(flag)

    def live_stats(self) -> dict[str, Any]:
        return {**self.meter.live_stats(), "context_tokens": self.in_context(), "context_limit": self.context_window}

    def in_context(self) -> int | None:
        """The backend's count of the sequence's context; one that reports it only at the end (Ollama): the
        prompt's estimate plus the tokens so far."""
        if self.context_tokens is not None:
            return self.context_tokens
        prompt = self.progress.prompt_tokens if self.progress is not None else None
        return None if prompt is None else prompt + self.meter.events

    def accept(self, chunk: StreamChunk, now: float) -> None:
        self.last_read_at = now
        chunk = chunk.storable()  # what is published is what can be stored
        if chunk.context_tokens is not None:
            self.context_tokens = chunk.context_tokens
        if chunk.stats is not None and chunk.stats.prompt_tokens is not None:
            in_context = chunk.stats.prompt_tokens + (chunk.stats.cached_tokens or 0)  # prompt_n excludes the cache
            self.backend_prompt_tokens = in_context
            if self.progress is not None:
                self.progress.backend_prompt(in_context)
            quotas.context_check(prompt_tokens=in_context, limit=self.context_quota, estimated=False)
        if not chunk.carries:
            return
        if chunk.tool_calls is not None or chunk.logprobs is not None:
            self._accept_extras(chunk)
        self.meter.token(now, thought=bool(chunk.thinking), answer=bool(chunk.text))
        self.parts.append(chunk.text)
        self.pending.append(chunk.text)
        self.thoughts.append(chunk.thinking)
        self.pending_thoughts.append(chunk.thinking)
        if self.pending_since is None:
            self.pending_since = now

    def _accept_extras(self, chunk: StreamChunk) -> None:
        if chunk.tool_calls:
            self.tool_call_deltas.extend(chunk.tool_calls)
            self.pending_tool_calls.extend(chunk.tool_calls)
        content = (chunk.logprobs or {}).get("content")
        if isinstance(content, list):
            self.logprobs.extend(content)
            self.pending_logprobs.extend(content)


async def _start_progress(state: TurnStream, messages: list[dict[str, Any]]) -> None:
    """The board's progress for this turn, and the slot's context window for the live stats."""
    try:
        progress = await live_progress.progress_start(state.turn, messages, state.redis)
    except Exception:  # the board is a view of the turn, never a reason to fail it
        log.exception("turn %s: board progress could not start", state.turn.pk)
        return
    if progress.prompt_estimated and state.backend_prompt_tokens is not None:
        progress.backend_prompt(state.backend_prompt_tokens)
    state.progress, state.context_window = progress, progress.n_ctx


async def _check_loading(state: TurnStream, rig: Rig, model: str) -> None:
    """Whether the server has to load the model first (``loading.model_needs_load``), asked as the request goes out.
    Then the page shows "loading the model" and the turn waits longer for its first token
    (``loading.first_answer_limit_s``)."""
    if not await model_needs_load(rig, model):
        return
    if state.meter.events:  # the first token came meanwhile: it was loaded after all
        return
    state.loading = True
    if state.prompt_state is not None:
        await state.prompt_state.loading()


async def _decoding(state: TurnStream) -> None:
    """The first token is out: the turn is decoding, and the monitoring sampler, which reads an idle rig less often,
    hears of it and samples the rig at once. Not sooner: a sample while the backend reads the prompt would take a
    core from it, on the turn's time to first token."""
    try:
        await db_async(gated(lifecycle.turn_mark_decoding))(turn=state.turn)
    except DatabaseError as exc:  # a view of the phase: the pages have the tokens, and the end is stored whole
        log.warning("turn %s: could not mark it decoding: %r", state.turn.pk, exc)
    try:
        await events.rig_decoding(rig_id=state.turn.session.rig_id)
    except Exception as exc:  # without it the sampler still finds the turn at its next idle tick
        log.warning("turn %s: could not wake the monitoring sampler: %r", state.turn.pk, exc)


async def stream_turn(
    turn: Turn,
    request: ChatRequest,
    redis_client: aioredis.Redis,
    *,
    context_quota: int | None = None,
    prompt_state: PromptState | None = None,
    opened: OpenedStream | None = None,
) -> lifecycle.TurnOutcome:
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
        pace=pace_for_loop(),
        context_quota=context_quota,
        prompt_state=prompt_state,
    )
    state.last_checkpoint = state.last_read_at = state.meter.t_request
    side: list[asyncio.Task[None]] = []

    def side_tasks() -> None:
        side.append(asyncio.create_task(_start_progress(state, request.messages)))
        if not state.meter.events:  # a token already read: the model was loaded, nothing to ask
            side.append(asyncio.create_task(_check_loading(state, turn.session.rig, request.model)))

    if not opened.early:  # tokens read before the claim go out before these begin (below)
        side_tasks()
    final: StreamChunk | None = None
    status, error, finish_reason, detail = Turn.Status.DONE, "", "", ""
    refused: dict[str, Any] = {}
    try:
        with state.pace.streaming_turn():
            opened.bind(state)
            if state.pending:  # read before the turn was claimed: out at once
                await state.publish()
            if not side:
                side_tasks()
            final = await _watch(state, opened.reader, conf)
        finish_reason = final.finish_reason or "stop"
    except TurnCancelled:
        status, finish_reason = Turn.Status.CANCELLED, "cancelled"
    except TurnTimeout as exc:
        status, finish_reason, error = Turn.Status.FAILED, "timeout", str(exc)
    except QuotaExceeded as exc:  # the backend's prompt_n is over the user's context limit
        status, finish_reason, error = Turn.Status.FAILED, exc.code, exc.message
    except BackendError as exc:  # the owner reads a plain reason; the detail is in the stats, for staff
        status, finish_reason, detail = Turn.Status.FAILED, exc.code, str(exc)
        error = user_message(turn.session.rig.name, exc)
        if isinstance(exc, BackendRefused):  # an API client gets the server's status and words back
            refused = {"status": exc.status, "message": exc.words}
    finally:
        await opened.close()  # the backend stops decoding this reply
        for task in side[1:]:  # the loading check; the reporter ends with the stream
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        if state.decoding is not None:  # also when this task is cancelled: no write left running without an owner
            await asyncio.gather(state.decoding, return_exceptions=True)
    if state.pending:
        await state.flush()
    if state.decoding is not None:
        await state.decoding
    return lifecycle.TurnOutcome(
        status=status,
        reply_text=state.text,
        thinking_text=state.thinking,
        finish_reason=finish_reason,
        stats={
            **_load_split(state, state.meter.final_stats(final.stats if final else None)),
            "context_tokens": state.context_tokens,
            "request_sent_by": opened.sent_by,
            "context_limit": state.context_window,
            **_history_cut(state, request),
            **({"tool_calls": tool_calls_merged(state.tool_call_deltas)} if state.tool_call_deltas else {}),
            **({"logprobs": state.logprobs} if state.logprobs else {}),
            **({"stop_sequence": final.stop_word} if final is not None and final.stop_word else {}),
            **({"native_ending": final.ending} if final is not None and final.ending else {}),
            **({"error_detail": detail} if detail else {}),
            **({"backend_refused": refused} if refused else {}),
        },
        error=error,
    )


def _load_split(state: TurnStream, stats: dict[str, Any]) -> dict[str, Any]:
    """A reply whose server loaded the model first without timing the load (llama-server in router or sleep mode;
    Ollama times its own): the wait before the prompt was read is the time to first token less the server's prompt
    time, shown apart from the time to first token as Ollama's load is."""
    ttft, prompt_ms = stats.get("ttft_ms"), stats.get("prompt_ms")
    if not state.loading or stats.get("load_ms") is not None or ttft is None or prompt_ms is None:
        return stats
    load_ms = round(max(ttft - prompt_ms, 0.0), 2)
    return {**stats, "load_ms": load_ms, "ttft_after_load_ms": round(ttft - load_ms, 2), "load_timed_by": "RigDash"}


def _history_cut(state: TurnStream, request: ChatRequest) -> dict[str, Any]:
    """``history_truncated`` when the backend read clearly less of the prompt than was sent: Ollama cuts the oldest
    messages to fit its window without a word (server/prompt.go chatPrompt); the chat and the board show it."""
    sent = estimate_prompt_tokens(request.messages)
    read, window = state.backend_prompt_tokens, state.context_window
    if not history_truncated(sent_estimate=sent, read=read, window=window):
        return {}
    return {"history_truncated": {"sent_estimate": sent, "read": read, "window": window}}


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
        # Before the first token, longer while the server loads the model (_check_loading).
        limit = first_answer_limit_s(conf, loading=state.loading) if state.meter.events == 0 else conf.stall_timeout_s
        if now - state.last_read_at > limit:
            phase = "the first token" if state.meter.events == 0 else "the next token"
            await _stop(
                state, reader, TurnTimeout(f"The backend sent nothing for {limit:g} s while waiting for {phase}.")
            )
        if now - state.last_checkpoint >= conf.checkpoint_interval_s:
            state.last_checkpoint = now
            try:
                await db_async(gated(lifecycle.turn_checkpoint))(
                    turn_id=state.turn.pk, reply_text=state.text, thinking_text=state.thinking
                )
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
