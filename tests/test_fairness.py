"""Fair queueing: turns wait in RigDash's table and start round-robin across users as the rig's slots free up."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.test.utils import CaptureQueriesContext

from inference import events
from inference.models import LastServed, Turn
from inference.queue import dispatch
from inference.queue.dispatch import Waiting, fair_order
from inference.turns import lifecycle, submit
from inference.worker import start as starts
from tests.adminkit import make_session, make_user, quiet
from tests.conftest import wait_until

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _w(turn_id: int, user_id: int, seconds: int) -> Waiting:
    return Waiting(turn_id=turn_id, user_id=user_id, session_id=turn_id, created_at=T0 + timedelta(seconds=seconds))


def test_one_users_burst_does_not_go_before_other_users_turns():
    burst = [_w(1, 10, 0), _w(2, 10, 1), _w(3, 10, 2)]
    others = [_w(4, 20, 3), _w(5, 30, 4)]
    # User 10 was just served; 20 and 30 never were.
    order = fair_order(burst + others, {10: T0})
    assert [w.turn_id for w in order] == [4, 5, 1, 2, 3]


def test_users_alternate_and_the_least_recently_served_goes_first():
    waiting = [_w(1, 10, 0), _w(2, 10, 1), _w(3, 20, 2), _w(4, 20, 3), _w(5, 30, 4)]
    last = {10: T0 + timedelta(minutes=5), 20: T0 + timedelta(minutes=1), 30: T0 + timedelta(minutes=3)}
    assert [w.turn_id for w in fair_order(waiting, last)] == [3, 5, 1, 4, 2]


def test_never_served_users_go_in_order_of_their_oldest_turn_and_each_users_turns_stay_in_order():
    waiting = [_w(7, 2, 5), _w(3, 1, 9), _w(9, 2, 1), _w(4, 1, 2)]
    order = fair_order(waiting, {})
    assert [w.turn_id for w in order] == [9, 4, 7, 3]
    assert fair_order([], {}) == []


@pytest.mark.django_db(transaction=True)
def test_dispatch_never_hands_out_more_turns_than_the_rig_has_slots(rig, model_name, owner, other_user):
    """No worker listens to this rig's queue: dispatched tasks wait in the broker, so only the marking is seen."""
    rig.slots = 1
    rig.queue = "rig.nobody-listens"
    rig.save()
    sessions = [make_session(user, rig, model_name) for user in (owner, owner, owner, other_user)]
    turns = [submit.turn_submit(session=s, text=f"hello {i}") for i, s in enumerate(sessions)]
    assert list(Turn.objects.filter(dispatched_at__isnull=False).values_list("pk", flat=True)) == [turns[0].pk]
    # The other user's turn goes before the owner's 2nd and 3rd, though it came last.
    assert [dispatch.queue_position(t) for t in Turn.objects.order_by("id")] == [0, 2, 3, 1]

    # Many dispatchers at once (web processes, workers, beat) hand out no more than the one free slot.
    Turn.objects.filter(pk=turns[0].pk).update(status=Turn.Status.DONE)

    def go(_: int) -> list[int]:
        try:
            return dispatch.rig_dispatch(rig_id=rig.pk)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = [ids for ids in pool.map(go, range(8)) if ids]
    assert results == [[turns[3].pk]]
    assert Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__isnull=False).count() == 1


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_task_delivered_for_a_waiting_turn_runs_it_once_and_lost_tasks_are_resent(rig, model_name, owner):
    rig.slots = 1
    rig.queue = "rig.nobody-listens"
    rig.save()
    turn = submit.turn_submit(session=make_session(owner, rig, model_name), text="Say yes.", params={"max_tokens": 4})
    turn.refresh_from_db()
    old = turn.dispatched_at
    assert old is not None
    Turn.objects.filter(pk=turn.pk).update(dispatched_at=old - timedelta(minutes=10))
    assert dispatch.dispatch_resend_stale(older_than_s=120) == [turn.pk]
    assert dispatch.dispatch_resend_stale(older_than_s=120) == []  # resent once, not every pass
    assert starts.turn_run(turn.pk) == "ran"
    assert starts.turn_run(turn.pk) == "not-claimed"


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_one_slot_rig_serves_users_round_robin_against_the_real_worker(celery_worker, rig, model_name):
    """A rig with one slot on the test llama-server: user A's burst of three, then B's and C's single turns."""
    rig.slots = 1
    rig.save()
    users = {name: make_user(name) for name in ("alice", "bob", "carol")}
    order = ["alice", "alice", "alice", "bob", "carol"]
    sessions = [make_session(users[name], rig, model_name) for name in order]
    long = {"temperature": 0.7, "seed": 3, "max_tokens": 400}
    short = {"temperature": 0, "max_tokens": 4}
    first = submit.turn_submit(session=sessions[0], text="Write a long story about a storm at sea.", params=long)
    wait_until(lambda: Turn.objects.get(pk=first.pk).status == Turn.Status.DECODING, timeout_s=60, what="A1 decoding")
    turns = [first] + [submit.turn_submit(session=s, text="Say hi.", params=short) for s in sessions[1:]]

    # While A1 holds the only slot, the others wait in the fair order: B, C, then A's own.
    positions = {}
    for name, _session, turn in zip(order, sessions, turns, strict=True):
        client = Client()
        client.force_login(users[name])
        snapshot = client.get(f"/api/turns/{turn.pk}").json()["turn"]
        positions[turn.pk] = (snapshot["queue_position"], snapshot["queue_ahead"])
    a1, a2, a3, b1, c1 = (t.pk for t in turns)
    assert positions == {a1: (None, None), b1: (1, 0), c1: (2, 1), a2: (3, 2), a3: (4, 3)}
    assert Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__isnull=False).count() == 0

    lifecycle.turn_cancel(turn=Turn.objects.get(pk=a1))  # free the slot now rather than after 400 tokens
    wait_until(lambda: not Turn.objects.filter(status__in=Turn.ACTIVE).exists(), timeout_s=120, what="all turns to end")
    ended = list(Turn.objects.order_by("started_at"))
    assert [t.pk for t in ended] == [a1, b1, c1, a2, a3]
    assert all(t.status == Turn.Status.DONE for t in ended[1:]), [(t.pk, t.status, t.error) for t in ended]
    for earlier, later in itertools.pairwise(ended):  # one slot: never two at once
        assert earlier.finished_at <= later.started_at


@pytest.mark.django_db(transaction=True)
def test_the_page_hears_of_a_turn_before_it_is_handed_to_a_worker(rig, model_name, owner, monkeypatch):
    """A fast backend's first token must not reach the page before the turn does (the stress benchmark saw it
    when turn.queued was published after the Celery task was sent)."""
    rig.queue = "rig.nobody-listens"
    rig.save()
    order: list[str] = []
    real_queued, real_send = events.turns_queued_sync, dispatch._send
    monkeypatch.setattr(events, "turns_queued_sync", lambda turns: (order.append("queued"), real_queued(turns))[1])

    def send(ids: list[int], queue: str, *tickets: Any, **kwargs: Any) -> None:
        order.append(f"send {len(ids)}")
        real_send(ids, queue, *tickets, **kwargs)

    monkeypatch.setattr(dispatch, "_send", send)
    submit.turn_submit(session=make_session(owner, rig, model_name), text="hello")
    assert order == ["queued", "send 1"]
    # A session made in the submit's own transaction (an API request's) has no page yet: its task goes first, and
    # its announcement after it, off the reply's way to its first token.
    order.clear()
    with transaction.atomic():
        submit.turn_submit(session=make_session(owner, rig, model_name), text="hello", new_session=True)
    assert order == ["send 1", "queued"]


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_submits_tells_each_page_once_that_its_turn_starts(rig, model_name, owner, monkeypatch):
    """Each submit re-announces the queue; a turn already starting must not be told again (n submits sent n^2/2
    messages, which held up the stress benchmark's burst), while the board still gets every position."""
    rig.slots = 4
    rig.queue = "rig.nobody-listens"
    rig.save()
    calls: list[tuple[list[tuple[int, int, int]], list[tuple[int, int, int]] | None]] = []
    real = events.queue_positions_sync

    def spy(*, rig_id: int, waiting: list[tuple[int, int, int]], pages: Any = None, **rest: Any) -> None:
        calls.append((waiting, pages))
        real(rig_id=rig_id, waiting=waiting, pages=pages, **rest)

    monkeypatch.setattr(events, "queue_positions_sync", spy)
    turns = [submit.turn_submit(session=make_session(owner, rig, model_name), text=f"hi {i}") for i in range(4)]
    told = [(turn_id, position) for _, pages in calls for _, turn_id, position in pages or []]
    assert sorted(told) == sorted((t.pk, 0) for t in turns)  # each page hears "starting" once
    board_view = {turn_id: position for _, turn_id, position in calls[-1][0]}
    assert board_view == {t.pk: 0 for t in turns}  # the board sees every starting turn


@pytest.mark.django_db(transaction=True)
def test_the_order_reads_one_row_per_waiting_user_whatever_the_rigs_history(rig, model_name, owner, other_user):
    """Who was served last comes from LastServed (written by each hand-out), not from every turn the rig ran."""
    quiet(rig)
    rig.slots = 1
    rig.save()
    mine, theirs = make_session(owner, rig, model_name), make_session(other_user, rig, model_name)
    first = submit.turn_submit(session=mine, text="first")  # takes the slot: owner served now
    served = LastServed.objects.get(rig=rig, user=owner)
    assert served.at == Turn.objects.get(pk=first.pk).dispatched_at
    old = T0 - timedelta(days=30)
    Turn.objects.bulk_create(  # a long history for the other user, all long ago
        Turn(session=theirs, rig=rig, user_text="old", status=Turn.Status.DONE, dispatched_at=old) for _ in range(300)
    )
    LastServed.objects.create(rig=rig, user=other_user, at=old)
    burst = [submit.turn_submit(session=make_session(owner, rig, model_name), text=f"b{i}") for i in range(2)]
    late = submit.turn_submit(session=theirs, text="late")
    with CaptureQueriesContext(connection) as queries:
        order = [w.turn_id for w in dispatch.waiting_order(rig)]
    assert order == [late.pk, *(t.pk for t in burst)]  # served a month ago goes before served just now
    assert len(queries) == 2 and "inference_lastserved" in queries[-1]["sql"]  # the rig's turns, then one row each
    assert "MAX(" not in " ".join(q["sql"] for q in queries).upper()


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_last_served_from_each_users_latest_hand_out_on_each_rig():
    executor = MigrationExecutor(connection)
    executor.migrate([("inference", "0009_placement")])
    apps = executor.loader.project_state([("inference", "0009_placement")]).apps
    user_model, rig_model = apps.get_model("auth", "User"), apps.get_model("inference", "Rig")
    session_model, turn_model = apps.get_model("inference", "ChatSession"), apps.get_model("inference", "Turn")
    user = user_model.objects.create(username="historic")
    rigs = [
        rig_model.objects.create(name=f"r{i}", kind="llamacpp", base_url="http://x:1", queue=f"q{i}") for i in (1, 2)
    ]
    for rig, hours in ((rigs[0], (1, 5)), (rigs[1], (3,))):
        session = session_model.objects.create(owner=user, rig=rig, model_name="m")
        for h in hours:
            turn_model.objects.create(session=session, rig=rig, user_text="x", dispatched_at=T0 + timedelta(hours=h))
        turn_model.objects.create(session=session, rig=rig, user_text="never handed out")
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    rows = {(r.rig.name, r.at) for r in LastServed.objects.filter(user_id=user.pk).select_related("rig")}
    assert rows == {("r1", T0 + timedelta(hours=5)), ("r2", T0 + timedelta(hours=3))}
