"""The two pipeline changes the benchmark led to (docs/changelog.md): the coalescing throttle and the
consumer's token fast path. The end-to-end effect is measured by ./scripts/bench, not here."""

from __future__ import annotations

import contextlib
import json

import pytest

from inference import events
from inference.consumers.chat import ChatConsumer
from inference.live import progress as live_progress
from inference.live import state as live
from inference.worker import stream as turn_stream
from inference.worker.pace import FlushPace, StreamMeter
from inference.worker.stream import TurnStream


def _stream(interval_s: float = 0.033) -> TurnStream:
    # flush_due reads only the timing fields; no turn or Redis is needed to ask it.
    return TurnStream(
        turn=None,  # type: ignore[arg-type]
        redis=None,  # type: ignore[arg-type]
        link=None,  # type: ignore[arg-type]
        meter=StreamMeter(t_request=0.0),
        pace=FlushPace(interval_s, interval_s),
    )


def _on_tick(at: float, interval: float) -> bool:
    return abs(at / interval - round(at / interval)) < 1e-6


def _at_tick(at: float, interval: float, within_s: float = 0.005) -> bool:
    """A batch due at a tick is stamped with the tick; one sent at once is stamped when it went, which on a loaded
    machine is a little after the tick (the loop's timer woke late) or a little before it (the read gate wakes a
    slack early, and a token an interval after the last batch goes at once)."""
    past = at % interval
    return min(past, interval - past) < within_s


def test_a_lone_token_goes_out_at_once_and_a_burst_waits_for_the_loops_next_tick():
    stream = _stream()
    assert stream.flush_due() is None  # nothing pending
    stream.pending_since = 1.0
    assert stream.flush_due() == 1.0  # nothing sent yet: the first token goes at once
    stream.last_sent = stream.last_due = 1.0  # the first batch went at once, off the loop's ticks
    stream.pending_since = 1.007
    assert stream.flush_due() == pytest.approx(1.023)  # 7 ms after it: the loop's next tick (31 x 33 ms)
    stream.last_due, stream.last_sent = 1.023, 1.0214  # due at that tick, sent a slack's time before it
    stream.pending_since = 1.030
    assert stream.flush_due() == pytest.approx(1.056)  # a flowing stream: one interval later, on the next tick
    stream.pending_since = 1.5
    assert stream.flush_due() == 1.5  # a token long after the last batch (slow decode) is not held back


def test_turns_on_one_loop_have_their_batches_due_at_the_same_ticks_and_no_token_waits_longer_than_an_interval():
    pace = FlushPace(0.033, 0.033)
    turns = [_stream() for _ in range(16)]
    for n, turn in enumerate(turns):
        turn.pace = pace
        turn.last_sent = turn.last_due = 5.0 + n * 0.0021  # their first batches went at their own times
        turn.pending_since = turn.last_sent + 0.001
    due = {round(turn.flush_due(), 9) for turn in turns}  # type: ignore[arg-type]
    assert len(due) <= 2 and all(_on_tick(d, 0.033) for d in due)  # together, on the loop's ticks
    for k in range(2000):  # any last batch and any token after it
        turn = turns[k % 16]
        turn.last_due = turn.last_sent = 7.0 + (k * 0.00731) % 0.5
        turn.pending_since = turn.last_sent + (k * 0.0173) % 0.06
        due = turn.flush_due()
        assert due is not None and 0 <= due - turn.pending_since <= 0.033 + 1e-9  # no token waits over an interval
        if due > turn.pending_since:  # held: to the next tick, and from there on the ticks
            assert _on_tick(due, 0.033) and due > turn.last_due
            turn.last_due, turn.last_sent, turn.pending_since = due, due - 0.001, due + 0.001  # sent just before
            assert turn.flush_due() == pytest.approx(due + 0.033)


def test_a_turn_alone_gets_the_short_interval_and_each_other_streaming_turn_adds_half_of_it_up_to_the_ceiling():
    pace = FlushPace(0.010, 0.033)
    alone = TurnStream(turn=None, redis=None, link=None, meter=StreamMeter(t_request=0.0), pace=pace)  # type: ignore[arg-type]
    alone.last_sent = alone.last_due = 1.0
    alone.pending_since = 1.001
    expected = {1: 0.010, 2: 0.015, 4: 0.025, 6: 0.033}  # six would be 35 ms: held at the 33 ms ceiling
    for turns, interval in expected.items():
        with contextlib.ExitStack() as streaming:
            for _ in range(turns):
                streaming.enter_context(pace.streaming_turn())
            assert pace.interval() == pytest.approx(interval)
            due = alone.flush_due()
            assert due is not None and _on_tick(due, interval)
            assert 1.0 < due <= 1.0 + interval + 1e-9
    assert pace.streaming == 0 and pace.interval() == pytest.approx(0.010)
    with pytest.raises(RuntimeError), pace.streaming_turn():
        raise RuntimeError("a turn that fails still leaves the count")
    assert pace.streaming == 0


async def test_the_turns_on_one_loop_share_a_pace_built_from_the_settings(settings):
    import dataclasses

    from inference.worker.pace import pace_for_loop as _pace_for_loop

    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, flush_interval_ms=30, flush_min_interval_ms=12)
    pace = _pace_for_loop()
    assert _pace_for_loop() is pace and (pace.min_s, pace.max_s) == (0.012, 0.030)
    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, flush_interval_ms=33, flush_min_interval_ms=33)
    fixed = _pace_for_loop()
    with fixed.streaming_turn():
        assert fixed.interval() == pytest.approx(0.033)  # min = ceiling: the old fixed interval


@pytest.mark.parametrize(("env", "message"), [
    ({"RIGDASH_FLUSH_MIN_INTERVAL_MS": "40"}, "RIGDASH_FLUSH_MIN_INTERVAL_MS must be between 1 and 20, got 40"),
    ({"RIGDASH_FLUSH_INTERVAL_MS": "34"}, "RIGDASH_FLUSH_INTERVAL_MS must be between 1 and 33, got 34"),
    ({"RIGDASH_FLUSH_INTERVAL_MS": "8", "RIGDASH_FLUSH_MIN_INTERVAL_MS": "9"}, "must be between 1 and 8, got 9"),
    ({"RIGDASH_FLUSH_INTERVAL_MS": "8"}, "flush 8 8"),  # the default shortest interval follows a lower ceiling
    ({}, "flush 10 20"),
])  # fmt: skip
def test_the_shortest_interval_is_checked_against_the_ceiling_when_settings_load(env, message):
    import os
    import subprocess
    import sys

    code = "from rigdash.settings import RIGDASH as r; print('flush', r.flush_min_interval_ms, r.flush_interval_ms)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIGDASH_FLUSH")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert message in done.stdout + done.stderr


async def test_token_batches_skip_the_per_message_database_hop(monkeypatch):
    """Spies on channels' aclose_old_connections (a thread hop) to see which events take it."""
    import channels.consumer

    hops: list[int] = []

    async def spy() -> None:
        hops.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", spy)
    consumer = ChatConsumer()
    consumer.scope = {}  # no user: the frame limit's anonymous bucket (Channels sets the scope per connection)
    sent: list[str] = []

    async def base_send(message: dict[str, str]) -> None:
        sent.append(message["text"])

    consumer.base_send = base_send  # the ASGI send: what would go to the socket
    token = events.token_batch_message(turn_id=1, seq_from=1, seq_to=2, text="hé <b>", stats={"tokens": 2})
    await consumer.dispatch(token)
    assert hops == []
    assert sent[0] == token["frame"]  # serialised once by the worker, forwarded as is
    frame = {"type": "token", "turn": 1, "seq_from": 1, "seq_to": 2, "text": "hé <b>", "stats": {"tokens": 2}}
    assert json.loads(sent[0]) == frame
    await consumer.dispatch({"type": "chat.turn_state", "turn": 1, "status": "prompt"})
    assert hops == []  # every chat event only sends a frame
    assert json.loads(sent[1]) == {"type": "turn.state", "turn": 1, "status": "prompt"}
    await consumer.dispatch({"type": "websocket.receive", "text": "not json"})
    assert hops == [1]  # the browser's frames (which may touch the database) still close stale connections first
    assert json.loads(sent[2])["code"] == "bad_json"


def test_backend_clients_share_one_tls_context_that_still_verifies_certificates():
    import ssl

    from inference.backends.llamacpp import chat as llamacpp

    context = llamacpp.tls_context()
    assert context is llamacpp.tls_context()  # built once per process, not per turn
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    client = llamacpp.LlamaCppBackend("http://127.0.0.1:9", timeout_s=1)._client(read_timeout=None)
    assert client._transport._pool._ssl_context is context  # httpx internals: the context the pool connects with


async def test_worker_publishes_token_batches_on_the_channel_layers_own_channel():
    """The runner pipelines PUBLISH with its RPUSH (one round trip per batch); the channel name and bytes must
    be exactly what channels_redis' group_send would publish, or no socket would hear the batch."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    message = events.token_batch_message(turn_id=7, seq_from=3, seq_to=5, text="abc", stats={"tokens": 5})
    publication = events.pubsub_publication(events.session_group(42), message)
    assert publication is not None
    channel, payload = publication
    assert channel == layer._get_layer()._get_group_channel_name(events.session_group(42))  # channels_redis internals
    assert layer.deserialize(payload) == message


def test_other_channel_layers_fall_back_to_group_send(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert events.pubsub_publication("g", {"type": "chat.token"}) is None


def _recording(stream: TurnStream, *, decoding_done: bool = True) -> list[list[str]]:
    """Replace the stream's flush (no Redis here) by one that records what each batch would send; the first batch's
    "decoding" mark (a database write) is taken as done unless the test watches it."""
    import asyncio
    import time

    flushed: list[list[str]] = []

    async def flush() -> None:
        due, now = stream.flush_due(), time.perf_counter()
        flushed.append(list(stream.pending))
        stream.seq_sent = stream.meter.events
        stream.pending.clear()
        stream.pending_since = None
        stream.last_sent = time.perf_counter()
        stream.last_due = max(due, now) if due is not None else now

    stream.flush = flush  # type: ignore[method-assign]
    if decoding_done:
        stream.decoding = asyncio.get_running_loop().create_future()
        stream.decoding.set_result(None)
    return flushed


async def test_chunks_read_together_go_out_in_one_batch_at_the_read_gate():
    """The llama.cpp backend reads the socket at most once per batch, so several tokens arrive at once; the batch
    goes out at the gate after the read, with all of them (flushing after the first held the rest a whole interval).
    Then the gate holds the next read until just before the next batch could go: the loop's next tick, and from
    there one interval."""
    import time

    from inference.backends.base import StreamChunk

    stream = _stream()
    interval = stream.flush_interval_s
    now = time.perf_counter()
    stream.meter.token(now - 0.05)  # one token already went out, 50 ms ago: the next batch is due at once
    stream.parts, stream.seq_sent, stream.last_sent = ["a"], 1, now - 0.05
    flushed = _recording(stream)
    for text in ("b", "c", "d"):
        stream.accept(StreamChunk(text=text), time.perf_counter())
    assert flushed == []  # nothing goes out per chunk
    await stream.read_gate()
    assert flushed == [["b", "c", "d"]]
    tick = stream.next_slot()
    assert _on_tick(tick, interval) and time.perf_counter() >= tick - 0.003  # the next read waited for the tick
    stream.accept(StreamChunk(text="e"), time.perf_counter())  # that read's token
    await stream.read_gate()
    assert flushed[-1] == ["e"] and stream.last_due == pytest.approx(tick, abs=0.005)  # its batch went at the tick
    stream.accept(StreamChunk(text="f"), time.perf_counter())
    await stream.read_gate()
    assert flushed[-1] == ["f"] and stream.last_due == pytest.approx(tick + interval, abs=0.005)  # an interval later
    assert time.perf_counter() >= tick + interval - 0.003


@pytest.mark.parametrize(("gap_s", "waits"), [(0.1, False), (0.005, True)])
async def test_after_a_batch_the_gate_holds_the_next_read_only_while_tokens_come_faster_than_batches(gap_s, waits):
    """Batches go every 50 ms. Tokens 100 ms apart: the next one comes after its batch is due anyway, so the next
    read goes at once and waits for it (holding it would add a timer's wake-up to every token). Tokens 5 ms apart:
    the next read waits until the next batch is due (the loop's next tick), and finds the tokens that came
    meanwhile."""
    import time

    from inference.backends.base import StreamChunk

    stream = _stream(interval_s=0.05)
    flushed = _recording(stream)
    now = time.perf_counter()
    for k, text in enumerate(("a", "b", "c", "d", "e")):  # as read: the last one just now
        stream.accept(StreamChunk(text=text), now - (4 - k) * gap_s)
    started = time.perf_counter()
    await stream.read_gate()
    held = time.perf_counter() - started
    assert flushed == [["a", "b", "c", "d", "e"]]  # the first batch goes at once either way
    assert stream.tokens_outpace_batches() is waits
    if waits:
        assert time.perf_counter() >= stream.next_slot() - 0.003  # until just before the next batch may go
    else:
        assert held < 0.02
    stream.accept(StreamChunk(text="f"), time.perf_counter())  # the next read's token
    await stream.read_gate()
    assert flushed[-1] == ["f"]
    assert _at_tick(stream.last_due, 0.05)  # either way, at the loop's next tick: at most two batches an interval
    assert time.perf_counter() >= stream.last_due - 0.003


async def test_the_first_token_goes_out_at_once_and_a_cancel_seen_by_a_batch_ends_the_reader(monkeypatch):
    import time

    from inference.backends.base import StreamChunk
    from inference.worker.stream import TurnCancelled

    stream = _stream(interval_s=0.5)
    flushed = _recording(stream, decoding_done=False)
    decoding: list[bool] = []

    async def mark_decoding(state: object) -> None:
        decoding.append(True)

    monkeypatch.setattr(turn_stream, "_decoding", mark_decoding)
    stream.accept(StreamChunk(text="Hi"), time.perf_counter())
    started = time.perf_counter()
    await stream.publish()
    assert flushed == [["Hi"]] and time.perf_counter() - started < 0.05
    assert stream.decoding is not None
    await stream.decoding
    assert decoding == [True]
    stream.cancelled = True  # what the batch's GET of the cancel flag found
    stream.accept(StreamChunk(text=" there"), time.perf_counter())
    with pytest.raises(TurnCancelled):
        await stream.publish()
    assert flushed[-1] == [" there"]  # the batch went out first, whole
    assert decoding == [True]  # once per turn


async def test_a_stop_lets_a_batch_being_sent_go_out_whole_and_cancels_a_reader_that_waits():
    """The watchdog's stop (a cancel, a timeout) never cuts a batch off half sent: the reader raises the reason once
    the batch is out. A reader waiting on the backend is cancelled at once."""
    import asyncio
    import time

    from inference.backends.base import StreamChunk
    from inference.worker.stream import TurnCancelled, TurnTimeout, _stop

    stream = _stream()
    sent: list[list[str]] = []

    async def slow_flush() -> None:
        batch = list(stream.pending)
        await asyncio.sleep(0.05)  # the round trip to Redis
        sent.append(batch)
        stream.seq_sent = stream.meter.events
        stream.pending.clear()
        stream.pending_since = None
        stream.last_sent = time.perf_counter()

    stream.flush = slow_flush  # type: ignore[method-assign]
    stream.decoding = asyncio.get_running_loop().create_future()  # the first token's marking is not under test
    stream.decoding.set_result(None)
    stream.accept(StreamChunk(text="Hi"), time.perf_counter())
    reader = asyncio.create_task(stream.publish())
    await asyncio.sleep(0.01)  # the batch is on its way
    with pytest.raises(TurnCancelled):
        await _stop(stream, reader, TurnCancelled())
    assert sent == [["Hi"]]
    assert isinstance(reader.exception(), TurnCancelled)  # it ended on the reason, not cut off

    waiting = _stream()
    reader = asyncio.create_task(asyncio.sleep(10))  # a reader waiting on a read from the backend
    started = time.perf_counter()
    with pytest.raises(TurnTimeout):
        await _stop(waiting, reader, TurnTimeout("stalled"))
    assert reader.cancelled() and time.perf_counter() - started < 1


async def test_a_plugin_that_does_not_call_the_gate_has_what_it_read_together_handed_on_together():
    """The ollama client reads its stream itself and yields a buffered line at a time, without waiting: the runner
    reads it on a task of its own and calls the gate after each group that came in together (Ollama is mocked
    here: no Ollama server can run on this machine)."""
    import asyncio

    from inference.backends.base import StreamChunk
    from inference.worker.reader import _gathered

    async def ollama_like():
        for text in ("b", "c", "d"):  # one read of the socket brought three lines
            yield StreamChunk(text=text)
        await asyncio.sleep(0.02)
        yield StreamChunk(text="e")
        await asyncio.sleep(0.02)
        yield StreamChunk(text="", finish_reason="stop")

    seen: list[str] = []
    groups: list[list[str]] = []

    async def gate() -> None:
        groups.append(list(seen))

    async for chunk in _gathered(ollama_like(), gate):
        seen.append(chunk.text)
    assert groups == [["b", "c", "d"], ["b", "c", "d", "e"]]
    assert seen == ["b", "c", "d", "e", ""]


async def test_an_ungated_plugin_that_fails_fails_the_reader_with_its_error():
    from inference.backends.base import BackendUnavailable, StreamChunk
    from inference.worker.reader import _gathered

    async def failing():
        yield StreamChunk(text="a")
        raise BackendUnavailable("Ollama went away")

    async def gate() -> None:
        return None

    seen = []
    with pytest.raises(BackendUnavailable, match="went away"):
        async for chunk in _gathered(failing(), gate):
            seen.append(chunk.text)
    assert seen == ["a"]


async def test_a_flush_that_cannot_reach_redis_keeps_its_tokens_and_waits_before_trying_again():
    """Redis down: the batch stays pending (nothing lost, seq not advanced) and the next try is a quarter second
    away, not immediate (the consume loop would otherwise spin on connection errors)."""
    import time
    from types import SimpleNamespace

    from redis.exceptions import ConnectionError as RedisConnectionError

    class DownPipeline:
        def __init__(self) -> None:
            self.commands: list[str] = []

        async def __aenter__(self) -> DownPipeline:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        def __getattr__(self, name: str) -> object:
            return lambda *args: self.commands.append(name)

        async def execute(self) -> list[object]:
            raise RedisConnectionError("Error 111 connecting")

    stream = _stream()
    stream.turn = SimpleNamespace(pk=5, session_id=6)  # type: ignore[assignment]
    stream.link = SimpleNamespace(pipeline=lambda: DownPipeline())  # type: ignore[assignment]
    now = time.perf_counter()
    for text in ("a", "b"):
        stream.meter.token(now)
        stream.parts.append(text)
        stream.pending.append(text)
    stream.pending_since = now
    await stream.flush()
    assert stream.pending == ["a", "b"] and stream.seq_sent == 0 and stream.live.broken
    due = stream.flush_due()
    assert due is not None and due >= time.perf_counter() + 0.2


async def test_a_live_list_lost_between_two_flushes_is_rebuilt_whole(settings):
    """Redis restarted between two flushes and the client reconnected on its own: no command failed, but the list
    lost its first batches. The next RPUSH's reply shows it, and the list is rewritten as one batch 1..n (a page
    that resyncs from it would otherwise miss the start of the reply)."""
    import time
    from types import SimpleNamespace

    from redis import asyncio as aioredis

    from inference.live.link import RedisLink

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    stream = _stream()
    stream.turn = SimpleNamespace(pk=900_000 + time.monotonic_ns() % 100_000, session_id=6)  # type: ignore[assignment]
    stream.link = RedisLink(settings.REDIS_URL)
    key = live.live_key(stream.turn.pk)
    try:
        for text in ("Hello", " world", "!"):
            now = time.perf_counter()
            stream.meter.token(now)
            stream.parts.append(text)
            stream.pending.append(text)
            stream.pending_since = now
            await stream.flush()
            if text == "Hello":
                await client.delete(key)  # what a restart without persistence does to it
        snapshot = live.decode_snapshot(await client.lrange(key, 0, -1))
        assert (snapshot.text, snapshot.seq) == ("Hello world!", 3)
        assert await client.llen(key) == 2  # rebuilt as one batch 1..2, then batch 3 appended
    finally:
        await client.delete(key)
        await client.aclose()
        await stream.link.aclose()


async def test_a_token_accepted_while_a_batch_is_on_its_way_goes_in_the_next_batch(settings):
    """The turn's task publishes the tokens read before the claim while the reader goes on reading: a token accepted
    during that batch's round trip to Redis must stay pending for the next batch, not be cleared with the batch
    (the stored reply and the pages' text would differ by it, with no gap in the seqs to tell)."""
    import asyncio
    import time
    from types import SimpleNamespace

    from redis import asyncio as aioredis

    from inference.backends.base import StreamChunk
    from inference.live.link import RedisLink

    class SlowLink:  # the real link, with a slower round trip
        def __init__(self, link: RedisLink) -> None:
            self.link = link

        def pipeline(self) -> object:
            pipe = self.link.pipeline()
            execute = pipe.execute

            async def slow_execute() -> list[object]:
                await asyncio.sleep(0.05)
                return await execute()

            pipe.execute = slow_execute  # type: ignore[method-assign]
            return pipe

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    stream = _stream()
    stream.turn = SimpleNamespace(pk=800_000 + time.monotonic_ns() % 100_000, session_id=6)  # type: ignore[assignment]
    real_link = RedisLink(settings.REDIS_URL)
    stream.link = SlowLink(real_link)  # type: ignore[assignment]
    key = live.live_key(stream.turn.pk)
    try:
        stream.accept(StreamChunk(text="Hello"), time.perf_counter())
        on_its_way = asyncio.create_task(stream.flush())
        await asyncio.sleep(0.01)
        stream.accept(StreamChunk(text=" world"), time.perf_counter())  # the reader, meanwhile
        await on_its_way
        assert (stream.seq_sent, stream.pending) == (1, [" world"])
        assert stream.flush_due() is not None
        await stream.flush()
        snapshot = live.decode_snapshot(await client.lrange(key, 0, -1))
        assert (snapshot.text, snapshot.seq) == ("Hello world", 2)
    finally:
        await client.delete(key)
        await client.aclose()
        await real_link.aclose()


async def test_the_boards_progress_rides_in_a_batchs_round_trip_twice_a_second(settings):
    """A streaming turn's board progress (stored for a board that opens later, published to the open ones) goes
    in the pipeline of the batch it is due with: no round trips of its own, and only when due. The stream has
    no ``redis`` client here, so a tick on its own connection would fail this test."""
    import asyncio
    import time
    from types import SimpleNamespace

    from channels.layers import get_channel_layer
    from redis import asyncio as aioredis

    from inference.backends.base import StreamChunk
    from inference.live.link import RedisLink

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(events.BOARD_GROUP, channel)
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    stream = _stream(interval_s=0.001)
    stream.turn = SimpleNamespace(pk=700_000 + time.monotonic_ns() % 100_000, session_id=6)  # type: ignore[assignment]
    link = RedisLink(settings.REDIS_URL)
    round_trips: list[list[str]] = []
    execute = link.execute

    async def counted(commands):  # type: ignore[no-untyped-def]
        round_trips.append([command[0] for command in commands])
        return await execute(commands)

    link.execute = counted  # type: ignore[method-assign]
    stream.link = link
    stream.progress = live_progress.ProgressReporter(
        turn_id=stream.turn.pk, n_ctx=2048, prompt_tokens=20, interval_s=0.5
    )
    try:
        for text in ("Hello", " world", "!"):
            stream.accept(StreamChunk(text=text), time.perf_counter())
            await stream.flush()
        # One round trip per batch; the progress in the first (then not due for half a second).
        assert round_trips == [["RPUSH", "EXPIRE", "PUBLISH", "SET", "PUBLISH", "GET"], *[["RPUSH", "PUBLISH"]] * 2]
        message = await asyncio.wait_for(layer.receive(channel), 2)
        assert (message["type"], message["turn"], message["tokens"]) == ("board.progress", stream.turn.pk, 1)
        assert message["context_used"] == 21 and message["n_ctx"] == 2048
        stored = json.loads(await client.get(live_progress.progress_key(stream.turn.pk)))
        assert (
            stored["tokens"] == 1
            and 0 < await client.ttl(live_progress.progress_key(stream.turn.pk)) <= live.LIVE_TTL_S
        )
        stream.progress.last_sent -= 0.5  # half a second later
        stream.accept(StreamChunk(text="?"), time.perf_counter())
        await stream.flush()
        message = await asyncio.wait_for(layer.receive(channel), 2)
        assert message["tokens"] == 4 and round_trips[-1][:4] == ["RPUSH", "PUBLISH", "SET", "PUBLISH"]  # a GET if due
    finally:
        await layer.group_discard(events.BOARD_GROUP, channel)
        await client.delete(live.live_key(stream.turn.pk), live_progress.progress_key(stream.turn.pk))
        await client.aclose()
        await link.aclose()


async def test_while_batches_flow_they_read_the_cancel_flag_and_the_watchdog_reads_it_only_when_they_stop(settings):
    """The cancel flag costs one GET ten times a second, in the batches' own round trips while they flow; the turn's
    task reads it itself only when no batch has for WATCH_CANCEL_S (a prompt, a pause). A Stop is seen within
    0.25 s either way. Real Redis; the reader is a loop of batches every 10 ms, then a pause."""
    import asyncio
    import time
    from types import SimpleNamespace

    from redis import asyncio as aioredis

    from inference.backends.base import StreamChunk
    from inference.live.link import RedisLink
    from inference.worker.stream import TurnCancelled, _watch

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    stream = _stream(interval_s=0.001)
    stream.turn = SimpleNamespace(pk=600_000 + time.monotonic_ns() % 100_000, session_id=6)  # type: ignore[assignment]
    stream.link = RedisLink(settings.REDIS_URL)
    stream.decoding = asyncio.get_running_loop().create_future()  # the first token's marking is not under test
    stream.decoding.set_result(None)
    watchdog_reads: list[float] = []
    check_cancel = stream.check_cancel

    async def counted_check() -> None:
        watchdog_reads.append(time.perf_counter())
        await check_cancel()

    stream.check_cancel = counted_check  # type: ignore[method-assign]
    conf = SimpleNamespace(first_token_timeout_s=30, stall_timeout_s=30, checkpoint_interval_s=float("inf"))
    flowing = asyncio.Event()
    phases: dict[str, float] = {}

    async def reader() -> StreamChunk:
        phases["flow"] = time.perf_counter()
        while time.perf_counter() - phases["flow"] < 0.6:
            stream.accept(StreamChunk(text="x"), time.perf_counter())
            stream.last_read_at = time.perf_counter()
            await stream.publish()
            await asyncio.sleep(0.01)
        phases["pause"] = time.perf_counter()
        flowing.set()
        await asyncio.sleep(10)  # the backend reads a long prompt: no batches
        raise AssertionError("not cancelled")

    key = live.cancel_key(stream.turn.pk)
    try:
        task = asyncio.create_task(reader())
        watch = asyncio.create_task(_watch(stream, task, conf))  # type: ignore[arg-type]
        await flowing.wait()
        assert [t for t in watchdog_reads if t < phases["pause"]] == []  # the batches read it meanwhile
        await asyncio.sleep(0.5)
        assert not watch.done(), watch
        assert len(watchdog_reads) >= 2  # no batches: the watchdog reads it itself
        await client.set(key, "1")
        asked = time.perf_counter()
        with pytest.raises(TurnCancelled):
            await watch
        assert time.perf_counter() - asked < 0.25
    finally:
        await client.delete(key, live.live_key(stream.turn.pk))
        await client.aclose()
        await stream.link.aclose()
