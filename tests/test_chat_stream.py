"""A chat turn end to end: websocket -> Celery worker -> real llama-server -> Channels -> websocket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from inference.live import state as live
from inference.models import Turn
from inference.worker import stream as turn_stream
from tests.conftest import llama_busy_slots, session_cookie_for
from tests.wsclient import ChatSocket, token_frames

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.llama]

LONG_PROMPT = "Write a long story about a lighthouse keeper and a storm, with many details."


async def _send_and_get_turn(sock: ChatSocket, text: str, params: dict[str, Any]) -> int:
    await sock.send({"type": "turn.send", "text": text, "params": params})
    queued = await sock.recv_until(lambda f: f["type"] in ("turn.queued", "error"))
    assert queued["type"] == "turn.queued", queued
    return int(queued["turn"]["id"])


async def test_turn_streams_tokens_in_order_equal_to_stored_reply(celery_worker, chat_session, owner):
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    connected, _ = await sock.connect()
    assert connected
    snapshot = await sock.recv()
    assert snapshot == {"type": "session.snapshot", "session": chat_session.pk, "turns": []}

    turn_id = await _send_and_get_turn(sock, "Name three colours.", {"temperature": 0, "max_tokens": 48})
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id)
    await sock.close()

    tokens = token_frames(sock.frames, turn_id)
    assert tokens, "no token frames arrived"
    expected_from = 1
    for frame in tokens:  # contiguous, ordered batches
        assert frame["seq_from"] == expected_from
        assert frame["seq_to"] >= frame["seq_from"]
        expected_from = frame["seq_to"] + 1
    streamed = "".join(frame["text"] for frame in tokens)
    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.DONE
    assert streamed == turn.reply_text
    assert streamed.strip()
    assert end["turn"]["reply"] == turn.reply_text
    assert end["seq"] == tokens[-1]["seq_to"] == turn.stats["output_events"]
    # Stats: ours and llama.cpp's own.
    assert turn.finish_reason in ("stop", "length")
    assert turn.stats["ttft_ms"] > 0
    assert turn.stats["prompt_tokens"] > 0 and turn.stats["prompt_ms"] > 0
    assert turn.stats["output_tokens"] == turn.stats["backend_timings"]["predicted_n"]
    assert len(turn.stats["inter_token_gaps_ms"]) == turn.stats["output_events"] - 1
    if turn.stats["output_events"] > 2:
        assert turn.stats["decode_tps"] > 1
    # Coalescing: at most one batch per interval while the reply decodes (this turn streams alone, so the
    # interval is the shortest one; the first token goes at once and the end may flush what is left). A batch
    # due within FLUSH_SLACK_S goes at once, so two batches can be that much closer than the interval.
    if turn.stats["output_events"] >= 20:
        decoding_ms = (turn.stats["output_events"] - 1) / turn.stats["decode_tps"] * 1000
        spacing_ms = settings.RIGDASH.flush_min_interval_ms - turn_stream.FLUSH_SLACK_S * 1000
        assert len(tokens) <= decoding_ms / spacing_ms + 2


async def test_stop_keeps_partial_reply_and_backend_stops_decoding(celery_worker, chat_session, owner, llama_url):
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    turn_id = await _send_and_get_turn(sock, LONG_PROMPT, {"temperature": 0.7, "max_tokens": 1000, "seed": 1})
    seen = 0
    while seen < 10:
        frame = await sock.recv()
        if frame["type"] == "token" and frame["turn"] == turn_id:
            seen = frame["seq_to"]
    await sock.send({"type": "turn.cancel", "turn": turn_id})
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == turn_id, timeout=10)
    await sock.close()

    turn = await Turn.objects.aget(pk=turn_id)
    assert turn.status == Turn.Status.CANCELLED
    assert turn.finish_reason == "cancelled"
    streamed = "".join(f["text"] for f in token_frames(sock.frames, turn_id))
    assert turn.reply_text == streamed == end["turn"]["reply"]
    assert 10 <= turn.stats["output_events"] < 1000
    # llama-server freed the slot: nothing is decoding any more.
    for _ in range(40):
        if await sync_to_async(llama_busy_slots)(llama_url) == 0:
            break
        await asyncio.sleep(0.05)
    assert await sync_to_async(llama_busy_slots)(llama_url) == 0


async def test_reconnect_mid_turn_loses_and_doubles_nothing(celery_worker, chat_session, owner):
    cookie = await sync_to_async(session_cookie_for)(owner)
    first = ChatSocket(chat_session.pk, cookie)
    assert (await first.connect())[0]
    await first.recv()
    turn_id = await _send_and_get_turn(first, LONG_PROMPT, {"temperature": 0, "max_tokens": 300})
    seen = (await first.recv_until(lambda f: f["type"] == "token" and f["seq_to"] >= 5))["seq_to"]
    await first.close()
    # Tokens keep coming while no one listens (waited for, not slept: CI machines vary in speed).
    for _ in range(600):
        if (await sync_to_async(live.snapshot)(turn_id)).seq > seen + 3:
            break
        await asyncio.sleep(0.05)

    second = ChatSocket(chat_session.pk, cookie)
    assert (await second.connect())[0]
    snapshot = await second.recv()
    assert snapshot["type"] == "session.snapshot"
    current = snapshot["turns"][-1]
    assert current["id"] == turn_id
    text, seq = current["reply"], current["seq"]
    end = None
    if current["status"] in ("queued", "prompt", "decoding"):
        assert seq > seen, "the snapshot should hold the text decoded while disconnected"
        while end is None:
            frame = await second.recv()
            if frame["type"] == "token" and frame["turn"] == turn_id:
                if frame["seq_to"] <= seq:
                    continue  # already in the snapshot
                assert frame["seq_from"] == seq + 1, "a gap in seq"
                text += frame["text"]
                seq = frame["seq_to"]
            elif frame["type"] == "turn.end":
                end = frame
    await second.close()
    turn = await Turn.objects.aget(pk=turn_id)
    assert text == turn.reply_text
    assert seq == turn.stats["output_events"]


async def test_task_delivered_while_turn_runs_is_harmless(celery_worker, chat_session, owner):
    """A second delivery of a running turn's task (Celery redelivers with acks_late) claims nothing."""
    from inference.tasks import turn_run_task

    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    turn_id = await _send_and_get_turn(sock, "Count from one to ten.", {"temperature": 0, "max_tokens": 60})
    await sock.recv_until(lambda f: f["type"] == "token")
    await sync_to_async(turn_run_task.apply_async)(args=[turn_id], queue=chat_session.rig.queue)
    await sock.recv_until(lambda f: f["type"] == "turn.end")
    await asyncio.sleep(0.5)
    await sock.close()
    ends = [f for f in sock.frames if f["type"] == "turn.end"]
    assert len(ends) == 1
    tokens = token_frames(sock.frames, turn_id)
    assert [f["seq_from"] for f in tokens] == sorted({f["seq_from"] for f in tokens})
    turn = await Turn.objects.aget(pk=turn_id)
    assert "".join(f["text"] for f in tokens) == turn.reply_text
