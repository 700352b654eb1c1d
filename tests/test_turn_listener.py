"""inference/views/turn_listener.py against the real channel layer, Redis and database: a view hears a turn's events
as a chat socket does, and its reply comes out whole, in order and once each even when the layer drops batches or
the turn's end (the seq gap resyncs from the live list; a silent turn's row says when it ended)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from inference import events
from inference.live import state
from inference.models import ChatSession, Rig, Turn
from inference.views import turn_listener
from inference.views.turn_listener import TurnListener, reply_pieces

pytestmark = pytest.mark.django_db(transaction=True)
PARTS = ["Once", " upon", " a time", " there", " was a fox."]


@pytest.fixture
def turn(owner: Any) -> Turn:
    rig = Rig.objects.create(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.r")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    made = Turn.objects.create(session=session, user_text="Tell me a story.", status=Turn.Status.DECODING)
    client = state.sync_client()
    client.delete(state.live_key(made.pk))
    for seq, text in enumerate(PARTS[:4], start=1):  # what the worker appended so far; the last part never is
        client.rpush(state.live_key(made.pk), state.encode_batch(seq, seq, text))
    return made


def _token(turn: Turn, seq: int) -> dict[str, Any]:
    return events.token_batch_message(turn_id=turn.pk, seq_from=seq, seq_to=seq, text=PARTS[seq - 1], stats={})


def _end(turn: Turn, seq: int) -> dict[str, Any]:
    return {"type": "chat.turn_end", "turn": {"id": turn.pk, "status": "done"}, "seq": seq}


def _finish(turn: Turn) -> None:
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DONE, reply_text="".join(PARTS), output_tokens=5)


async def test_the_listener_hears_its_turns_group_on_the_real_layer_and_leaves_it(turn):
    listener = TurnListener(session_id=turn.session_id, turn_id=turn.pk)
    await listener.join()
    assert listener._direct  # RigDash's layer hands it events straight from its reader, as to an idle socket
    other = events.token_batch_message(turn_id=turn.pk + 1, seq_from=1, seq_to=1, text="not mine", stats={})
    deadline = time.monotonic() + 10
    while listener.inbox.empty():  # SUBSCRIBE is written, not awaited: publish until it holds
        assert time.monotonic() < deadline, "no event reached the listener"
        await events.group_send(events.session_group(turn.session_id), other)
        await events.group_send(events.session_group(turn.session_id), _token(turn, 1))
        await asyncio.sleep(0.02)
    event = await listener.next_event(1)
    assert event is not None and event["turn"] == turn.pk and event["seq_from"] == 1  # another turn's is left out
    layer = listener.layer._get_layer()
    channel = listener.channel
    await listener.leave()
    assert channel not in layer.direct and channel not in layer.channels
    assert not any(channel in members for members in layer.groups.values())


async def test_what_was_published_before_the_listener_joined_comes_at_once_and_the_row_is_asked_soon(turn):
    """A fast backend's first batches can be published before the view's listener joins the group (the worker's claim
    beats the submit's return): they come from the live list as the listener joins, not with the next batch; and
    since the turn's end may have gone by too, its row is asked soon, not after ``CHECK_S``."""
    listener = TurnListener(session_id=turn.session_id, turn_id=turn.pk)
    await listener.join()
    try:
        pieces = reply_pieces(listener)
        assert await asyncio.wait_for(anext(pieces), 0.5) == "Once upon a time there"  # seq 1-4, from the live list
        await sync_to_async(_finish)(turn)  # its end went by unheard
        rest = await asyncio.wait_for(_rest(pieces), turn_listener.CHECK_S / 2)
    finally:
        await listener.leave()
    *texts, ended = rest
    assert texts == [" was a fox."] and isinstance(ended, Turn) and ended.status == Turn.Status.DONE


async def _rest(pieces: Any) -> list[Any]:
    return [piece async for piece in pieces]


async def test_a_dropped_batch_is_read_back_from_the_live_list_and_nothing_comes_twice(turn):
    listener = TurnListener(session_id=turn.session_id, turn_id=turn.pk)  # fed by hand: the layer's deliveries
    for event in (_token(turn, 1), _token(turn, 3), _token(turn, 2), _token(turn, 4), _token(turn, 3)):
        listener._take(event)  # batch 2 was dropped, then comes late; 3 comes twice
    await sync_to_async(_finish)(turn)
    listener._take(_end(turn, 5))  # batch 5 was dropped: it is in the stored reply
    pieces = [piece async for piece in reply_pieces(listener)]
    *texts, ended = pieces
    assert isinstance(ended, Turn) and ended.status == Turn.Status.DONE
    assert texts == ["Once", " upon a time there", " was a fox."]  # 2-4 by the resync, then dropped when they come
    assert "".join(texts) == ended.reply_text


async def test_a_turn_whose_end_message_is_lost_ends_by_its_row(turn, monkeypatch):
    monkeypatch.setattr(turn_listener, "CHECK_S", 0.05)
    listener = TurnListener(session_id=turn.session_id, turn_id=turn.pk)
    listener._take(_token(turn, 1))
    pieces = reply_pieces(listener)
    assert await anext(pieces) == "Once"
    waiting = asyncio.ensure_future(anext(pieces))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # still running: no end is made up
    await sync_to_async(_finish)(turn)
    assert await asyncio.wait_for(waiting, 5) == " upon a time there was a fox."
    ended = await anext(pieces)
    assert isinstance(ended, Turn) and ended.reply_text == "".join(PARTS)


async def test_a_reasoning_models_thoughts_come_before_their_batchs_text_and_resync_too(owner):
    """A batch's thoughts are a piece of their own before its text; a dropped batch's thoughts are read back from the
    live list with its text, once."""
    rig = await Rig.objects.acreate(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.r")
    session = await ChatSession.objects.acreate(owner=owner, rig=rig, model_name="m")
    made = await Turn.objects.acreate(session=session, user_text="Why?", status=Turn.Status.DECODING)
    batches = [("Hmm,", ""), (" salt", ""), (" from rocks.", "Rivers"), ("", " carry it.")]  # (thinking, text)
    client = state.sync_client()
    for seq, (thought, text) in enumerate(batches, start=1):
        client.rpush(state.live_key(made.pk), state.encode_batch(seq, seq, text, thinking=thought))

    def token(seq: int) -> dict[str, Any]:
        thought, text = batches[seq - 1]
        return events.token_batch_message(turn_id=made.pk, seq_from=seq, seq_to=seq, text=text, stats={},
                                          thinking=thought)  # fmt: skip

    await Turn.objects.filter(pk=made.pk).aupdate(status=Turn.Status.DONE, reply_text="Rivers carry it.",
                                                   thinking_text="Hmm, salt from rocks.")  # fmt: skip

    async def heard(order: tuple[int, ...]) -> list[Any]:
        listener = TurnListener(session_id=session.pk, turn_id=made.pk)
        for seq in order:
            listener._take(token(seq))
        listener._take(_end(made, 4))
        *pieces, ended = [piece async for piece in reply_pieces(listener)]
        assert isinstance(ended, Turn)
        return pieces

    assert await heard((1, 2, 3, 4)) == [{"thinking": "Hmm,"}, {"thinking": " salt"}, {"thinking": " from rocks."},
                                         "Rivers", " carry it."]  # fmt: skip
    # 2 dropped: 2-4 by the resync (the live list holds all four), then dropped when they come
    assert await heard((1, 3, 2, 4)) == [{"thinking": "Hmm,"}, {"thinking": " salt from rocks."}, "Rivers carry it."]
