"""A burst of chat submits is stored together (inference/turns/submit_queue.py), each submit still gets its own answer,
and
the turns handed out together reach the worker in one task and start together.

The rigs' Celery queues have no worker: the turns are stored and dispatched, and run only where a test calls the
runner itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from inference import db, errors
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch
from inference.turns import selectors as turn_selectors
from inference.turns import submit, submit_queue
from inference.worker import claim
from inference.worker import start as starts
from tests.adminkit import make_session, make_user


def _quiet_rig(slots: int) -> Rig:
    return Rig.objects.create(
        name="burst", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.nobody-listens", slots=slots
    )


@pytest.mark.django_db(transaction=True)
async def test_a_burst_of_submits_is_stored_together_and_each_gets_its_own_answer(monkeypatch):
    owner, other = await sync_to_async(make_user)("owner"), await sync_to_async(make_user)("other")
    rig = await sync_to_async(_quiet_rig)(2)
    mine = [await sync_to_async(make_session)(owner, rig, "m") for _ in range(4)]
    theirs = await sync_to_async(make_session)(other, rig, "m")
    batches: list[int] = []
    real = submit.turn_submit_many

    def counting(requests: Any) -> Any:
        batches.append(len(requests))
        return real(requests)

    monkeypatch.setattr(submit, "turn_submit_many", counting)
    sends = [
        (owner, mine[0].pk, "first"),
        (owner, mine[1].pk, "second"),
        (owner, mine[2].pk, ""),  # empty: refused, loses nothing of the others
        (owner, theirs.pk, "not mine"),  # another user's session: as if it did not exist
        (owner, mine[3].pk, "third"),
        (owner, mine[0].pk, "again"),  # its session already has a turn waiting
    ]
    results = await asyncio.gather(
        *(submit_queue.submit(user=u, session_id=s, text=t) for u, s, t in sends), return_exceptions=True
    )

    assert sum(batches) == len(sends) and len(batches) < len(sends), batches
    stored = [r for r in results if isinstance(r, Turn)]
    assert [t.user_text for t in stored] == ["first", "second", "third"]
    assert [(t.session_id, t.status) for t in stored] == [
        (s.pk, Turn.Status.QUEUED) for s in (mine[0], mine[1], mine[3])
    ]
    assert isinstance(results[2], errors.InvalidInput) and results[2].code == "empty_message"
    assert isinstance(results[3], errors.NotFound)
    assert isinstance(results[5], errors.InvalidInput) and results[5].code == "turn_in_progress"
    in_db = await sync_to_async(lambda: sorted(Turn.objects.values_list("user_text", flat=True)))()
    assert in_db == ["first", "second", "third"]
    # One dispatch for the burst: the rig's two slots went to two of the turns, the third waits.
    dispatched = await sync_to_async(lambda: Turn.objects.filter(dispatched_at__isnull=False).count())()
    assert dispatched == 2


@pytest.mark.django_db(transaction=True)
async def test_a_failing_store_fails_every_submit_of_its_batch_and_the_next_batch_still_runs(monkeypatch):
    owner = await sync_to_async(make_user)("owner")
    rig = await sync_to_async(_quiet_rig)(4)
    sessions = [await sync_to_async(make_session)(owner, rig, "m") for _ in range(3)]
    real = submit.turn_submit_many
    calls = 0

    def fails_once(requests: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database went away")  # stands in for an outage of the database or Redis
        return real(requests)

    monkeypatch.setattr(submit, "turn_submit_many", fails_once)
    first = await asyncio.gather(
        *(submit_queue.submit(user=owner, session_id=s.pk, text="hi") for s in sessions[:2]), return_exceptions=True
    )
    assert all(isinstance(r, ConnectionError) for r in first), first
    assert await Turn.objects.acount() == 0
    turn = await submit_queue.submit(user=owner, session_id=sessions[2].pk, text="after the outage")
    assert turn.user_text == "after the outage" and await Turn.objects.acount() == 1


@pytest.mark.django_db(transaction=True)
async def test_when_the_task_queue_is_down_a_batchs_stored_turns_hear_it_and_a_refused_submit_keeps_its_reason(
    broker_down,
):
    """The broker refuses the Celery message (mocked, see ``broker_down``)."""

    owner = await sync_to_async(make_user)("owner")
    rig = await sync_to_async(_quiet_rig)(4)
    sessions = [await sync_to_async(make_session)(owner, rig, "m") for _ in range(2)]
    kept, refused = await asyncio.gather(
        submit_queue.submit(user=owner, session_id=sessions[0].pk, text="keep me"),
        submit_queue.submit(user=owner, session_id=sessions[1].pk, text=""),
        return_exceptions=True,
    )
    assert isinstance(kept, errors.QueueUnavailable) and isinstance(kept.__cause__, ConnectionRefusedError)
    assert isinstance(refused, errors.InvalidInput) and refused.code == "empty_message"
    turn = await Turn.objects.aget()
    assert (turn.user_text, turn.status, turn.dispatched_at) == ("keep me", Turn.Status.QUEUED, None)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_turns_handed_out_together_go_in_one_task_and_the_worker_runs_them_together(rig, model_name, owner, settings):
    """A burst's dispatch sends one Celery message for all its turns (read back from the real broker list), and
    starts.turns_run claims and runs them at once against the real llama-server; a second delivery is a no-op."""
    rig.slots, rig.queue = 3, f"rig.nobody-listens.{rig.pk}"
    rig.save()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(rig.queue)
    requests = [
        submit.SubmitRequest(user=owner, session_id=make_session(owner, rig, model_name).pk, text=f"Say {word}.")
        for word in ("yes", "no", "maybe")
    ]
    turns = submit.turn_submit_many(requests)
    ids = [t.pk for t in turns if isinstance(t, Turn)]
    assert len(ids) == 3
    messages = [json.loads(raw) for raw in broker.lrange(rig.queue, 0, -1)]
    assert len(messages) == 1, messages
    assert messages[0]["headers"]["task"] == "inference.turns_run"
    assert json.loads(base64.b64decode(messages[0]["body"]))[0] == [ids]
    Turn.objects.filter(pk__in=ids).update(params={"max_tokens": 4})
    assert starts.turns_run(ids) == dict.fromkeys(ids, "ran")
    done = list(Turn.objects.filter(pk__in=ids).values_list("status", "worker", "token_cap"))
    assert {status for status, _, _ in done} == {Turn.Status.DONE}
    assert len({worker for _, worker, _ in done}) == 1 and all(cap == 4 for _, _, cap in done)
    assert starts.turns_run(ids) == dict.fromkeys(ids, "not-claimed")
    broker.delete(rig.queue)


@pytest.mark.django_db(transaction=True)
def test_row_locks_are_taken_where_the_database_has_them():
    """On PostgreSQL (the suite's database) lock_rows issues SELECT ... FOR UPDATE; on SQLite, which has no row
    locks and whose transactions hold the write lock from BEGIN IMMEDIATE, it must issue nothing."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    owner = make_user("owner")
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        db.lock_rows(type(owner).objects.filter(pk=owner.pk))
    sql = [q["sql"] for q in queries.captured_queries]
    if connection.features.has_select_for_update:
        assert len(sql) == 1 and "FOR UPDATE" in sql[0]
    else:
        assert sql == []


@pytest.mark.django_db(transaction=True)
def test_a_batch_reads_each_turns_own_conversation_in_one_query():
    """turns_with_history: each turn comes with its session and rig, and its own session's earlier turns, oldest
    first, and nothing after it, all in one query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    owner = make_user("owner")
    rig = _quiet_rig(4)
    first, second = make_session(owner, rig, "m"), make_session(owner, rig, "m")
    Turn.objects.create(session=first, user_text="a1", reply_text="r1", status=Turn.Status.DONE)
    Turn.objects.create(session=first, user_text="a2", reply_text="", status=Turn.Status.CANCELLED)
    now_first = Turn.objects.create(session=first, user_text="a3")
    now_second = Turn.objects.create(session=second, user_text="b1")
    with CaptureQueriesContext(connection) as queries:
        turns, history = turn_selectors.turns_with_history([now_second.pk, now_first.pk])
        assert [turn.session.rig.pk for turn in turns] == [rig.pk, rig.pk]  # already read: no query
    assert len(queries.captured_queries) == 1
    assert [turn.pk for turn in turns] == [now_first.pk, now_second.pk]
    assert history[now_first.pk] == [
        {"role": "user", "content": "a1"},
        {"role": "assistant", "content": "r1"},
        {"role": "user", "content": "a2"},
        {"role": "user", "content": "a3"},
    ]
    assert history[now_second.pk] == [{"role": "user", "content": "b1"}]


@pytest.mark.django_db(transaction=True)
def test_while_a_board_is_open_a_bursts_statements_do_not_grow_with_it(monkeypatch):
    """The board's rows of a burst's turns are read together: with a board open (told here rather than opened), one
    submit and eight take the same number of statements, commit included (bench/store.py counts the same way)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inference import events

    sent: list[list[int]] = []
    monkeypatch.setattr(events, "board_watched", lambda: True)
    monkeypatch.setattr(events, "board_turns_sync", lambda *, rows: sent.append([row["id"] for row in rows]))
    owner = make_user("owner")
    rig = _quiet_rig(16)
    counts = []
    for burst in (1, 8):
        sessions = [make_session(owner, rig, "m") for _ in range(burst)]
        ChatSession.objects.filter(pk__in=[s.pk for s in sessions]).update(title="titled")  # no first-message title
        requests = [submit.SubmitRequest(user=owner, session_id=session.pk, text="hi") for session in sessions]
        with CaptureQueriesContext(connection) as queries:
            stored = submit.turn_submit_many(requests)
        assert all(isinstance(turn, Turn) for turn in stored)
        assert sent[-1] == [turn.pk for turn in stored]  # every turn's row, in order
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("bulk_returns_ids", [True, False])
@pytest.mark.django_db(transaction=True)
def test_a_burst_of_submits_stores_its_turns_in_one_insert(settings, monkeypatch, bulk_returns_ids):
    """Sixteen submits together (the benchmark's level 3) are one INSERT, not sixteen: each was a statement the ORM
    built and the database ran, on every turn's way to its first token (docs/changelog.md). Each turn still gets
    its own id, in the order the submits came, and its creation time; a refused submit inserts nothing. A database
    whose bulk insert returns no ids (not PostgreSQL or SQLite; the flag is turned off here) gets one per turn."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(connection.features, "can_return_rows_from_bulk_insert", bulk_returns_ids)
    owner = make_user("owner")
    rig = _quiet_rig(16)
    sessions = [make_session(owner, rig, "m") for _ in range(16)]
    requests = [submit.SubmitRequest(user=owner, session_id=s.pk, text=f"hi {i}") for i, s in enumerate(sessions)]
    requests.insert(3, submit.SubmitRequest(user=owner, session_id=sessions[5].pk, text=""))  # refused
    with CaptureQueriesContext(connection) as queries:
        results = submit.turn_submit_many(requests)
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('INSERT INTO "inference_turn"')]
    assert len(inserts) == (1 if bulk_returns_ids else 16), inserts
    assert isinstance(results[3], errors.InvalidInput) and results[3].code == "empty_message"
    turns = [r for r in results if isinstance(r, Turn)]
    assert [(t.session_id, t.user_text) for t in turns] == [(s.pk, f"hi {i}") for i, s in enumerate(sessions)]
    assert all(t.pk is not None for t in turns) and [t.pk for t in turns] == sorted(t.pk for t in turns)
    stored = {t.pk: t for t in Turn.objects.all()}
    assert len(stored) == 16
    assert all((stored[t.pk].session_id, stored[t.pk].created_at) == (t.session_id, t.created_at) for t in turns)
    assert all(stored[t.pk].dispatched_at is not None for t in turns)  # 16 slots: all handed out together
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(rig.queue)


@pytest.mark.django_db(transaction=True)
def test_a_lone_turns_way_to_its_backend_request_takes_few_queries(monkeypatch, settings):
    """Every query from a submit to the worker's backend request is on the turn's time to first token: on a busy
    2-core rig each is a round trip and a wake-up of the database (docs/changelog.md, 2026-11-30, "Fewer
    round trips"). A lone submit on a rig with a free slot stores and dispatches its turn in one transaction, with
    no savepoint, before its Celery message goes; the worker's start reads the turn with its history, reads the
    owner's limits and claims it in one UPDATE. A change that adds a query here must say why."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inference.tasks import turns_run_task

    owner = make_user("owner")
    rig = _quiet_rig(2)
    session = make_session(owner, rig, "m")
    Turn.objects.create(session=session, user_text="before", reply_text="earlier", status=Turn.Status.DONE)
    ChatSession.objects.filter(pk=session.pk).update(title="before")  # a first turn also stores the title
    sent_at: list[int] = []
    real_send = turns_run_task.apply_async
    with CaptureQueriesContext(connection) as queries:

        def counting_send(*args: Any, **kwargs: Any) -> Any:
            sent_at.append(len(queries.captured_queries))
            return real_send(*args, **kwargs)

        monkeypatch.setattr(turns_run_task, "apply_async", counting_send)
        [turn] = submit.turn_submit_many([submit.SubmitRequest(user=owner, session_id=session.pk, text="hi")])
    assert isinstance(turn, Turn) and len(sent_at) == 1
    before_send = [q["sql"] for q in queries.captured_queries[: sent_at[0]]]
    assert not [sql for sql in before_send if "SAVEPOINT" in sql]
    # BEGIN; the session read with its row lock; its turns (any running? and the conversation for the start ticket);
    # the owner's limits (none: no lock on the owner);
    # the INSERT; the rig's row lock (on SQLite, which has no row locks, the rig read with the session is reused);
    # the rig's turns; the dispatch's UPDATE; COMMIT. It was 17 before.
    assert len(before_send) == (9 if connection.features.has_select_for_update else 8), "\n".join(before_send)
    with CaptureQueriesContext(connection) as queries:
        started = claim.turns_start(turn_ids=[turn.pk], worker="w1")
    claimed = started[turn.pk]
    assert claimed is not None and claimed.turn.session.rig.pk == rig.pk
    assert claimed.messages == [
        {"role": "user", "content": "before"},
        {"role": "assistant", "content": "earlier"},
        {"role": "user", "content": "hi"},
    ]
    # Without its ticket (a turn that waited for a slot): the turn with its session, rig and history; the owner's
    # limits; the claim with its token cap. It was 7. With it, the request goes first (tests/test_tickets.py).
    assert len(queries.captured_queries) == 3, "\n".join(q["sql"] for q in queries.captured_queries)
    assert Turn.objects.get(pk=turn.pk).token_cap == settings.RIGDASH.max_reply_tokens
    assert claim.turns_start(turn_ids=[turn.pk], worker="w2") == {turn.pk: None}  # a second delivery
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(rig.queue)


@pytest.mark.django_db(transaction=True)
def test_a_turn_cancelled_between_the_workers_read_and_its_claim_is_left_out(monkeypatch):
    """The worker reads the turns before its claim's UPDATE: a turn cancelled in between is not claimed, and the
    others of the same task still are, each with its own history (a race made certain here by cancelling inside
    the read)."""
    owner = make_user("owner")
    rig = _quiet_rig(4)
    kept, dropped = (Turn.objects.create(session=make_session(owner, rig, "m"), user_text=t) for t in ("a", "b"))
    real_read = turn_selectors.turns_with_history

    def read_then_cancel(turn_ids: Any) -> Any:
        read = real_read(turn_ids)
        Turn.objects.filter(pk=dropped.pk).update(status=Turn.Status.CANCELLED, cancel_requested=True)
        return read

    monkeypatch.setattr(claim, "turns_with_history", read_then_cancel)
    started = claim.turns_start(turn_ids=[kept.pk, dropped.pk], worker="w1")
    assert started[dropped.pk] is None
    claimed = started[kept.pk]
    assert claimed is not None and claimed.messages == [{"role": "user", "content": "a"}]
    assert list(Turn.objects.filter(pk=kept.pk).values_list("status", "worker")) == [(Turn.Status.PROMPT, "w1")]
    assert Turn.objects.get(pk=dropped.pk).status == Turn.Status.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_a_turn_whose_task_cannot_be_sent_goes_back_to_waiting_and_is_handed_out_again(broker_down, settings):
    """The broker refuses the Celery message (mocked, see ``broker_down``): the submit's answer is QueueUnavailable
    (which pages and API clients are shown), the turn is kept and waits again instead of holding a slot until the
    120 s resend, and the next dispatch hands it out."""

    owner = make_user("owner")
    rig = _quiet_rig(1)
    session = make_session(owner, rig, "m")
    [refused] = submit.turn_submit_many([submit.SubmitRequest(user=owner, session_id=session.pk, text="hi")])
    assert isinstance(refused, errors.QueueUnavailable) and isinstance(refused.__cause__, ConnectionRefusedError)
    [turn] = Turn.objects.filter(session=session)
    assert (turn.status, turn.dispatched_at) == (Turn.Status.QUEUED, None)
    broker_down()  # back
    assert dispatch.rig_dispatch(rig_id=rig.pk) == [turn.pk]
    assert Turn.objects.get(pk=turn.pk).dispatched_at is not None
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(rig.queue)


@pytest.mark.django_db(transaction=True)
def test_claims_from_different_task_threads_go_through_one_thread_with_its_connection_kept(monkeypatch):
    """A task thread's database connection was new at nearly every turn (6 ms on PostgreSQL here, on the time to
    first token): Celery's fix-up closed it around each task, and each of the pool's threads has its own. The runner
    claims on its one claim thread instead: two tasks on two threads claim on the same thread, and the second finds
    its connection open."""
    import threading

    from django.db import connection

    seen: list[tuple[int, bool]] = []
    real_start = claim.turns_start

    def spying_start(**kwargs: Any) -> Any:
        seen.append((threading.get_ident(), connection.connection is not None))
        return real_start(**kwargs)

    monkeypatch.setattr(claim, "turns_start", spying_start)
    results: list[dict[int, str]] = []
    for _ in range(2):  # no such turn: each task claims nothing, after reading
        task_thread = threading.Thread(target=lambda: results.append(starts.turns_run([987654])))
        task_thread.start()
        task_thread.join(timeout=30)
    assert results == [{987654: "not-claimed"}] * 2
    assert len(seen) == 2 and seen[0][0] == seen[1][0] != threading.get_ident()
    assert seen[1][1], "the claim thread's connection was closed between two claims"
