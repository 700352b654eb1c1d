"""Model swaps on a router that holds a limited number of models (llama-server ``--models-max``): the turn that needs
a swap goes out, and no other model's turn follows it until it has started, so the loaded model drains and the
router swaps (inference/queue/swaps.py). Here with no server: the router's loaded models are set in Redis as the
sampler keeps them, and no worker listens to the rig's queue, so a dispatched turn stays dispatched until the test
moves it on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from inference.live import consumers, served
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch, swaps
from inference.queue.dispatch import Waiting
from inference.turns import lifecycle, selectors, submit
from tests.adminkit import make_session, make_user, quiet
from tests.conftest import session_cookie_for
from tests.wsclient import BoardSocket

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _state(loaded: set[str], models_max: int = 1, in_flight: list[tuple[str, bool]] | None = None) -> Any:
    return swaps.SwapState.read(loaded=loaded, models_max=models_max, in_flight=in_flight or [])


def test_the_turn_that_needs_a_swap_goes_out_and_other_models_wait_behind_it():
    state = _state({"A"}, in_flight=[("A", True)])
    # Fair order: user 2's B, then user 1's A, then user 3's B.
    assert state.choose(["B", "A", "B"], free=3) == [0, 2]  # B's turns follow B; A's waits for the swap
    assert state.swapping == {"B"}
    assert state.held_reason("A") == "waiting: the rig swaps to model B first"
    assert state.held_reason("B") == ""


def test_turns_ahead_of_the_swap_in_fair_order_still_go_out():
    state = _state({"A"})
    assert state.choose(["A", "B", "A", "B"], free=4) == [0, 1, 3]


def test_a_router_with_room_loads_the_model_without_holding_anyone():
    state = _state({"A"}, models_max=2, in_flight=[("A", True)])
    assert state.choose(["B", "A", "A"], free=3) == [0, 1, 2] and not state.swapping
    assert _state(set(), in_flight=[("A", False)]).choose(["A", "A"], free=2) == [0, 1]  # the first load: no swap


def test_a_swap_in_flight_holds_other_models_until_its_turn_decodes():
    waiting = _state({"A"}, in_flight=[("A", True), ("B", False)])
    assert waiting.choose(["A", "B"], free=2) == [1]
    # B decodes: loaded whatever the kept list (from before the swap) says; A's turn now needs the swap back.
    started = _state({"A"}, in_flight=[("B", True)])
    assert started.choose(["A", "B"], free=2) == [0] and started.swapping == {"A"}


def test_slots_still_bound_the_hand_out():
    assert _state({"A"}).choose(["B", "B", "B"], free=2) == [0, 1]


@pytest.fixture(autouse=True)
def _workers_listen(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a worker consumed the rig's queue (none does: its turns stay dispatched), so that the page's reason is
    the swap's, not "no worker"."""
    monkeypatch.setattr(consumers, "unconsumed", lambda queue: False)


def _rig(name: str, models_max: int | None) -> Rig:
    rig = quiet(Rig.objects.create(name=name, kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", slots=4))
    rig.record_server_models_max(models_max)
    rig.record_models(["A", "B"])
    return rig


def _dispatched(turn: Turn) -> bool:
    return Turn.objects.get(pk=turn.pk).dispatched_at is not None


def _reason(turn: Turn) -> str:
    return str(
        selectors.turn_snapshot(Turn.objects.select_related("session__rig", "rig").get(pk=turn.pk))["waiting_reason"]
    )


def _start(turn: Turn, status: str = Turn.Status.DECODING) -> None:
    Turn.objects.filter(pk=turn.pk).update(status=status)


def _end(turn: Turn) -> None:
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DONE)
    dispatch.rig_dispatch(rig_id=turn.rig_id or turn.session.rig_id)


@pytest.mark.django_db(transaction=True)
def test_a_steady_user_of_the_loaded_model_waits_in_the_fair_queue_while_the_router_swaps(owner, other_user):
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, ["A"])
    steady = submit.turn_submit(session=make_session(owner, rig, "A"), text="a1")
    _start(steady)
    swap = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
    assert _dispatched(swap)  # the router queues it and swaps once A idles
    held = submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")
    assert not _dispatched(held)
    assert _reason(held) == "waiting: the rig swaps to model B first"
    assert selectors.turn_snapshot(Turn.objects.get(pk=held.pk))["queue_position"] == 1

    _end(steady)  # A drains; the router loads B, whose turn is still loading
    assert not _dispatched(held)
    _start(swap, Turn.Status.PROMPT)
    assert dispatch.rig_dispatch(rig_id=rig.pk) == []
    _start(swap)  # B's first token: it has started
    assert dispatch.rig_dispatch(rig_id=rig.pk) == [held.pk]
    assert _reason(held) == ""


@pytest.mark.django_db(transaction=True)
def test_the_swapped_in_turns_first_token_sends_the_held_turns_at_once(owner, other_user):
    """The worker marks a turn decoding at its first token (lifecycle.turn_mark_decoding): on a router with a model
    limit that dispatches the rig, so the held turns need not wait for some turn's end."""
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, ["A"])
    steady = submit.turn_submit(session=make_session(owner, rig, "A"), text="a1")
    _start(steady)
    swap = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
    held = submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")
    _end(steady)
    _start(swap, Turn.Status.PROMPT)
    assert not _dispatched(held)

    lifecycle.turn_mark_decoding(turn=Turn.objects.select_related("session").get(pk=swap.pk))
    assert Turn.objects.get(pk=swap.pk).status == Turn.Status.DECODING
    assert _dispatched(held) and _reason(held) == ""


@pytest.mark.django_db(transaction=True)
def test_a_first_token_on_a_rig_without_a_model_limit_dispatches_nothing(owner, monkeypatch):
    rig = _rig("plain", None)
    turn = submit.turn_submit(session=make_session(owner, rig, "A"), text="a1")
    _start(turn, Turn.Status.PROMPT)
    monkeypatch.setattr(dispatch, "rig_dispatch", lambda **kwargs: pytest.fail("dispatched a rig without swaps"))
    lifecycle.turn_mark_decoding(turn=Turn.objects.select_related("session").get(pk=turn.pk))
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.DECODING


@pytest.mark.django_db(transaction=True)
def test_turns_for_the_model_swapped_in_may_follow_it(owner, other_user):
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, ["A"])
    third = make_user("third")
    _start(submit.turn_submit(session=make_session(owner, rig, "A"), text="a1"))
    first = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
    held = submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")
    follows = submit.turn_submit(session=make_session(third, rig, "B"), text="b2")
    assert [_dispatched(t) for t in (first, held, follows)] == [True, False, True]


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_swap_lets_the_loaded_models_turns_go(owner, other_user):
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, ["A"])
    _start(submit.turn_submit(session=make_session(owner, rig, "A"), text="a1"))
    swap = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
    held = submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")
    assert not _dispatched(held)
    Turn.objects.filter(pk=swap.pk).update(status=Turn.Status.CANCELLED)  # as its worker ends it (turn_released)
    assert dispatch.rig_dispatch(rig_id=rig.pk) == [held.pk]


@pytest.mark.django_db(transaction=True)
def test_a_placed_turn_that_needs_a_swap_holds_the_other_models_turns_too(owner, other_user):
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, ["A"])
    _start(submit.turn_submit(session=make_session(owner, rig, "A"), text="a1"))
    placed = ChatSession.objects.create(
        owner=other_user, rig=rig, model_name="B", placement=ChatSession.Placement.MODEL
    )
    swap = submit.turn_submit(session=placed, text="b1")
    held = submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")
    assert _dispatched(swap) and Turn.objects.get(pk=swap.pk).rig_id == rig.pk
    assert not _dispatched(held) and _reason(held) == "waiting: the rig swaps to model B first"


@pytest.mark.django_db(transaction=True)
def test_a_router_whose_loaded_models_are_not_known_hands_out_as_any_rig(owner, other_user):
    rig = _rig("router", 1)
    served.loaded_store(rig.pk, None)
    _start(submit.turn_submit(session=make_session(owner, rig, "A"), text="a1"))
    turns = [
        submit.turn_submit(session=make_session(u, rig, m), text="hi") for u, m in ((other_user, "B"), (owner, "A"))
    ]
    assert all(_dispatched(t) for t in turns)


@pytest.mark.django_db(transaction=True)
def test_a_rig_without_a_model_limit_reads_nothing_more(owner, other_user, monkeypatch):
    rig = _rig("plain", None)
    served.loaded_store(rig.pk, ["A"])
    read: list[Any] = []
    monkeypatch.setattr(served, "loaded_get_many", lambda ids: read.append(ids) or {})
    _start(submit.turn_submit(session=make_session(owner, rig, "A"), text="a1"))
    waiting = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
    Turn.objects.filter(pk=waiting.pk).update(dispatched_at=None)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:  # as inside a submit
        assert dispatch.rig_dispatch(rig_id=rig.pk) == [waiting.pk]
    assert len(queries) == 3 and read == []  # lock the rig, read its turns, mark the turn


def test_waiting_turns_carry_their_chats_model():
    item = Waiting(turn_id=1, user_id=1, session_id=1, created_at=T0 + timedelta(seconds=1), model="B")
    assert swaps.SwapState.read(loaded={"A"}, models_max=1, in_flight=[]).held({item}, []) == {}


@pytest.mark.django_db(transaction=True)
async def test_the_board_says_why_a_turn_waits_for_a_swap_and_clears_it_when_it_goes(owner, other_user, admin_user):
    """The board row of a turn a swap holds back carries its page's reason, in the snapshot and in each dispatch's
    queue message, and the message that hands it out clears it."""
    rig = await sync_to_async(_rig)("router", 1)
    await sync_to_async(served.loaded_store)(rig.pk, ["A"])
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()

    def submit_three() -> tuple[Turn, Turn, Turn]:
        steady = submit.turn_submit(session=make_session(owner, rig, "A"), text="a1")
        _start(steady)
        swap = submit.turn_submit(session=make_session(other_user, rig, "B"), text="b1")
        return steady, swap, submit.turn_submit(session=make_session(owner, rig, "A"), text="a2")

    steady, swap, held = await sync_to_async(submit_three)()
    why = "waiting: the rig swaps to model B first"
    row = await sock.recv_until(lambda f: f["type"] == "turn" and f["turn"]["id"] == held.pk)
    assert (row["turn"]["queue_position"], row["turn"]["waiting_reason"]) == (1, why)
    await sock.send({"type": "board.resync"})
    snapshot = await sock.recv_until(lambda f: f["type"] == "board.snapshot")
    assert {r["id"]: r["waiting_reason"] for r in snapshot["turns"]} == {steady.pk: "", swap.pk: "", held.pk: why}

    await sync_to_async(_end)(steady)  # a dispatch that still holds it says so again
    queue = await sock.recv_until(lambda f: f["type"] == "queue" and str(held.pk) in f["positions"])
    assert queue["reasons"] == {str(held.pk): why}
    await sync_to_async(_start)(swap, Turn.Status.PROMPT)
    mark = lifecycle.turn_mark_decoding
    await sync_to_async(mark)(turn=await sync_to_async(Turn.objects.select_related("session").get)(pk=swap.pk))
    queue = await sock.recv_until(lambda f: f["type"] == "queue" and f["positions"].get(str(held.pk)) == 0)
    assert queue["reasons"] == {}
    await sock.close()
