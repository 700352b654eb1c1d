"""How long a token may wait for its batch on a worker's loop (``FlushPace``), and one reply's client-side timings
(``StreamMeter``). The contract is docs/streaming.md's."""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from inference.backends.base import BackendStats

# Told each step of every pace's count of streaming turns (+1, -1). The process that runs the worker registers its
# listeners (rigdash/celery.py: the CPU split's signal); this layer knows none of them.
streaming_listeners: list[Callable[[int], None]] = []


def _tell_listeners(step: int) -> None:
    for listener in streaming_listeners:
        listener(step)


@dataclass
class StreamMeter:
    """Client-side timings of one reply (perf_counter seconds); see ../shared performance definitions."""

    t_request: float
    t_first: float | None = None
    t_last: float | None = None
    events: int = 0
    gaps_ms: list[float] = field(default_factory=list)
    # A reasoning model's thoughts are output too (the first of them is the first token), counted apart.
    thinking_events: int = 0
    t_first_thought: float | None = None
    t_first_answer: float | None = None

    def token(self, now: float, *, thought: bool = False, answer: bool = True) -> None:
        if self.t_first is None:
            self.t_first = now
        elif self.t_last is not None:
            self.gaps_ms.append(round((now - self.t_last) * 1000, 3))
        self.t_last = now
        self.events += 1
        if thought:
            self.thinking_events += 1
            if self.t_first_thought is None:
                self.t_first_thought = now
        if answer and self.t_first_answer is None:
            self.t_first_answer = now

    def _since_request_ms(self, at: float | None) -> float | None:
        return None if at is None else round((at - self.t_request) * 1000, 2)

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
        stats = {"tokens": self.events, "ttft_ms": self.ttft_ms, "decode_tps": self.decode_tps}
        if self.thinking_events:
            stats["thinking_tokens"] = self.thinking_events
        return stats

    def reasoning_stats(self, backend_output_tokens: int | None) -> dict[str, Any]:
        """Thinking and answer apart. The backends count both in one figure (Ollama's eval_count, llama.cpp's
        predicted_n); the thinking share is counted here, one per chunk with thinking (one token each)."""
        answers = self.events - self.thinking_events
        if backend_output_tokens is not None and self.thinking_events:
            answers = max(0, backend_output_tokens - self.thinking_events)
        elif backend_output_tokens is not None:
            answers = backend_output_tokens
        return {
            "thinking_tokens": self.thinking_events,
            "answer_tokens": answers,
            "first_thought_ms": self._since_request_ms(self.t_first_thought),
            "first_answer_ms": self._since_request_ms(self.t_first_answer),
        }

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
            # The same meaning on every backend: the whole prompt, its cached part where told, the evaluation time
            # of the rest and its rate (an upper bound where the backend does not tell the cached part apart).
            stats["prompt_total_tokens"] = backend.prompt_total_tokens
            stats["prompt_cached_tokens"] = None if backend.prompt_counts_cached else backend.cached_tokens
            if (prefill := backend.prefill) is not None:
                stats["prefill_tps"], stats["prefill_tps_at_most"] = prefill
            if backend.load_ms is not None:
                stats["load_ms"] = backend.load_ms  # Ollama measures it on every reply: a loaded model's is ~0
                if backend.load_ms >= LOAD_SHOWN_MS and self.ttft_ms is not None:  # loaded for this reply
                    stats["ttft_after_load_ms"] = round(max(self.ttft_ms - backend.load_ms, 0.0), 2)
        stats.update(self.reasoning_stats(backend.output_tokens if backend is not None else None))
        return stats


# A load shorter than this is the scheduler finding the model loaded (Ollama's load_duration is never 0), not a load.
LOAD_SHOWN_MS = 100.0


class FlushPace:
    """How long a token may wait for its batch, shared by the turns streaming on one worker loop.

    A turn alone gets ``min_s``, so its page can show a token at the browser's next frame. Each other turn streaming
    on the loop adds half of ``min_s``, up to ``max_s``: the batches the worker publishes per second, and the frames
    the web writes for them, stay under 2 / ``min_s`` until every turn is at the ceiling (docs/streaming.md).
    A turn counts from its backend request to its end, so one still reading its prompt counts too: when many turns
    start together, the first to get tokens do not publish at the short interval while the rest are still in their
    prompts. After its first batch a turn's batches fall on the loop's ticks (``next_tick``)."""

    def __init__(self, min_s: float, max_s: float, on_change: Callable[[int], None] | None = None) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.streaming = 0
        self.on_change = on_change  # told each step of the count

    def _count(self, step: int) -> None:
        self.streaming += step
        if self.on_change is not None:
            self.on_change(step)

    def interval(self) -> float:
        return min(self.max_s, self.min_s * (max(1, self.streaming) + 1) / 2)

    def next_tick(self, at: float) -> float:
        """The loop's first flush tick at or after ``at`` (perf_counter seconds): the multiples of the interval,
        the same for every turn on the loop, so the batches of turns streaming together fall due together and go
        out in one Redis round trip (inference/live/link.py) and one wake-up of the loop."""
        interval = self.interval()
        return math.ceil(at / interval) * interval

    @contextlib.contextmanager
    def streaming_turn(self) -> Iterator[None]:
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)


# A batch due at a tick is past it by this when the next slot is read: the next slot is the following tick.
TICK_EPSILON_S = 1e-6


# Per event loop, keyed by the loop itself: an id can be reused by a later loop once the first is collected (tests
# run a loop per test), and a client or a pace belongs to the loop it was made on.
_paces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FlushPace] = weakref.WeakKeyDictionary()


def pace_for_loop() -> FlushPace:
    """The pace of the turns on this event loop (the worker runs them all on one: inference/worker/loop.py)."""
    loop = asyncio.get_running_loop()
    conf = settings.RIGDASH
    min_s, max_s = conf.flush_min_interval_ms / 1000, conf.flush_interval_ms / 1000  # the settings keep min <= max
    pace = _paces.get(loop)
    if pace is None or (pace.min_s, pace.max_s) != (min_s, max_s):  # new settings (tests override them)
        pace = _paces[loop] = FlushPace(min_s, max_s, on_change=_tell_listeners)
    return pace
