"""Start tickets (inference/queue/tickets.py): a turn stored and handed out by one submit carries what its backend
request
needs in its Celery message; the worker sends the request before its claim, and the claim still decides.

The worker here is the test calling the runner (the rigs' Celery queues have no worker, except where a test runs
one); the backend is the real llama-server.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from typing import Any

import httpx
import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.live import state as live
from inference.models import Quota, Rig, Turn
from inference.queue import dispatch
from inference.queue.tickets import StartTicket, ticket_from_message, tickets_by_turn
from inference.turns import lifecycle, submit
from inference.turns import selectors as turn_selectors
from inference.worker import claim
from inference.worker import start as starts
from inference.worker import stream as turn_stream
from tests.adminkit import make_session, make_user, quiet
from tests.conftest import llama_busy_slots, wait_until


def _task_kwargs(queue: str) -> list[dict[str, Any]]:
    """The kwargs of each Celery message waiting on a queue (read back from the real broker list), oldest first."""
    broker = redis.Redis.from_url(_broker_url())
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[1] for raw in reversed(broker.lrange(queue, 0, -1))]


def _broker_url() -> str:
    from django.conf import settings

    return str(settings.CELERY_BROKER_URL)


def _submit(owner: Any, session: Any, text: str, params: Any = None) -> Turn:
    [turn] = submit.turn_submit_many(
        [submit.SubmitRequest(user=owner, session_id=session.pk, text=text, params=params)]
    )
    assert isinstance(turn, Turn), turn
    return turn


def _handed_out(
    monkeypatch: Any, rig: Any, owner: Any, model_name: str, text: str, max_tokens: int
) -> tuple[Turn, list[Any]]:
    """A turn submitted on the rig (pointed at a queue no worker reads) and the tickets of its Celery message, as
    the worker would get them; this process counts as having run on the rig before."""
    quiet(rig)
    turn = _submit(owner, make_session(owner, rig, model_name), text, {"max_tokens": max_tokens})
    [kwargs] = _task_kwargs(rig.queue)
    redis.Redis.from_url(_broker_url()).delete(rig.queue)
    monkeypatch.setitem(starts._rigs_seen, rig.pk, (rig.kind, rig.base_url, rig.api_key))
    return turn, kwargs["tickets"]


@pytest.mark.django_db(transaction=True)
def test_a_submit_hands_its_turn_out_with_a_ticket_that_matches_what_the_worker_would_read(settings):
    owner = make_user("owner")
    rig = Rig.objects.create(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.t", slots=1)
    redis.Redis.from_url(_broker_url()).delete(rig.queue)
    session = make_session(owner, rig, "m")
    Turn.objects.create(session=session, user_text="before", reply_text="earlier", status=Turn.Status.DONE)
    Turn.objects.create(session=session, user_text="cut", reply_text="", status=Turn.Status.CANCELLED)
    Quota.objects.create(user=owner, max_tokens_per_reply=40, max_context_tokens=900)
    turn = _submit(owner, session, "hi", {"temperature": 0.5})
    [kwargs] = _task_kwargs(rig.queue)
    [raw] = kwargs["tickets"]
    ticket = ticket_from_message(raw)
    _, history = turn_selectors.turns_with_history([turn.pk])
    assert ticket == StartTicket(
        turn_id=turn.pk,
        rig_id=rig.pk,
        model="m",
        messages=history[turn.pk],
        params={"temperature": 0.5},
        max_tokens=40,  # the owner's per-reply limit, under the server's cap
        context_limit=900,
    )
    assert "base_url" not in json.dumps(raw) and "127.0.0.1" not in json.dumps(raw)  # never where to connect

    # A turn that waits for a slot is handed out later, by a dispatch that read nothing of it: no ticket.
    other = make_session(owner, rig, "m")
    waiting = _submit(owner, other, "later")
    assert Turn.objects.get(pk=waiting.pk).dispatched_at is None
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DONE)

    assert dispatch.rig_dispatch(rig_id=rig.pk) == [waiting.pk]
    assert _task_kwargs(rig.queue)[1] == {"rig_id": rig.pk}  # no ticket; the rig it was handed to
    redis.Redis.from_url(_broker_url()).delete(rig.queue)


@pytest.mark.django_db(transaction=True)
def test_the_task_message_shows_turn_ids_and_never_the_conversation_outside_its_body():
    """Celery copies a task's argsrepr and kwargsrepr into the message's headers, task events (Flower) and the
    worker's log of a failed task. RigDash gives its own (inference.queue.dispatch.task_reprs): Celery's own repr of the
    tickets cost a quarter of the send."""
    owner = make_user("owner")
    rig = Rig.objects.create(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.h", slots=1)
    broker = redis.Redis.from_url(_broker_url())
    broker.delete(rig.queue)
    session = make_session(owner, rig, "m")
    Turn.objects.create(session=session, user_text="my secret plan", reply_text="noted", status=Turn.Status.DONE)
    turn = _submit(owner, session, "and the password is swordfish")
    [raw] = broker.lrange(rig.queue, 0, -1)
    broker.delete(rig.queue)
    message = json.loads(raw)
    headers = json.dumps(message["headers"])
    assert "swordfish" not in headers and "secret plan" not in headers and "noted" not in headers
    assert message["headers"]["argsrepr"] == repr([[turn.pk]])
    shown = f"{{'tickets': <start tickets of turns [{turn.pk}]>, 'rig_id': {rig.pk}}}"
    assert message["headers"]["kwargsrepr"] == shown
    kwargs = json.loads(base64.b64decode(message["body"]))[1]
    assert kwargs["rig_id"] == rig.pk  # the claim takes the turn only while it is still handed to this rig
    [ticket] = kwargs["tickets"]  # the body still carries the ticket
    assert ticket["messages"][-1] == {"role": "user", "content": "and the password is swordfish"}


@pytest.mark.django_db(transaction=True)
def test_an_owner_with_a_daily_allowance_gets_no_ticket_and_the_start_reserves_from_it(settings):
    """Each start reserves from a daily allowance under the owner's row lock, so such a turn starts from a fresh
    read (its cap depends on what the others reserved meanwhile)."""
    owner = make_user("owner")
    rig = Rig.objects.create(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.t", slots=2)
    redis.Redis.from_url(_broker_url()).delete(rig.queue)
    Quota.objects.create(user=owner, max_output_tokens_per_day=30)
    turn = _submit(owner, make_session(owner, rig, "m"), "hi")
    assert _task_kwargs(rig.queue) == [{"rig_id": rig.pk}]  # no ticket
    claimed = claim.turns_start(turn_ids=[turn.pk], worker="w1")[turn.pk]
    assert claimed is not None and Turn.objects.get(pk=turn.pk).token_cap == 30
    # Another user's turn, through the single submit the HTTP API uses, has its ticket.
    other = make_user("other")
    theirs = submit.turn_submit(session=make_session(other, rig, "m"), text="hello")
    assert [t["turn_id"] for t in _task_kwargs(rig.queue)[1]["tickets"]] == [theirs.pk]
    redis.Redis.from_url(_broker_url()).delete(rig.queue)


def test_a_ticket_that_is_not_one_is_ignored():
    good = StartTicket(
        turn_id=1,
        rig_id=2,
        model="m",
        messages=[{"role": "user", "content": "x"}],
        params={},
        max_tokens=5,
        context_limit=None,
    ).as_message()
    assert ticket_from_message(good) is not None
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    api = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1",
           "content": "12"}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]  # fmt: skip
    assert ticket_from_message({**good, "messages": api}) is not None  # an API client's messages
    bad = [
        None,
        "ticket",
        {**good, "turn_id": "1"},
        {**good, "turn_id": True},
        {**good, "max_tokens": 0},
        {**good, "max_tokens": True},
        {**good, "context_limit": False},
        {**good, "messages": []},
        {**good, "messages": [{"role": "user"}]},
        {**good, "messages": [{"role": "user", "content": 3}]},
        {**good, "messages": [{"role": "assistant", "content": None}]},
        {**good, "context_limit": "900"},
        {**good, "unknown": 1},
        {k: v for k, v in good.items() if k != "model"},
    ]
    assert [ticket_from_message(raw) for raw in bad] == [None] * len(bad)
    assert tickets_by_turn([good, {**good, "turn_id": 7}], [1]) == {1: ticket_from_message(good)}
    assert tickets_by_turn("not a list", [1]) == {}


def _slots(llama_url: str) -> tuple[bool, dict[int, Any]]:
    """From one read of llama-server's /slots: whether a slot is busy, and each slot's last task id (absent until
    the slot has had one)."""
    slots = httpx.get(f"{llama_url}/slots").json()
    return any(slot.get("is_processing") for slot in slots), {slot["id"]: slot.get("id_task") for slot in slots}


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticketed_turns_request_reaches_the_backend_before_its_claim(rig, model_name, owner, monkeypatch):
    """The claim is held until llama-server reports the request in a slot: with the request sent after the claim,
    the wait would time out. The claim itself is two statements (the UPDATE, then the read of what it got) and
    the turn runs to its end with the ticket's cap."""
    turn, tickets = _handed_out(monkeypatch, rig, owner, model_name, "Count from one to fifty, in words.", 4)
    real_claim = claim._turns_claim_ticketed
    statements: list[int] = []
    _, tasks_before = _slots(rig.base_url)

    def the_backend_has_it() -> bool:
        # A slot busy with it, or a slot that has taken a new task since: four tokens take this llama-server
        # under 0.1 s on a fast machine, which a poll of busy slots alone can miss (it failed so once).
        busy, tasks = _slots(rig.base_url)
        return busy or tasks != tasks_before

    def claim_once_the_backend_has_it(**kwargs: Any) -> Any:
        wait_until(the_backend_has_it, timeout_s=10, what="the request in a slot")
        with CaptureQueriesContext(connection) as queries:
            result = real_claim(**kwargs)
        statements.append(len(queries.captured_queries))
        return result

    monkeypatch.setattr(claim, "_turns_claim_ticketed", claim_once_the_backend_has_it)
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "ran"}
    assert statements == [2]
    done = Turn.objects.get(pk=turn.pk)
    assert (done.status, done.token_cap, done.worker) == (Turn.Status.DONE, 4, starts.WORKER_ID)
    assert done.reply_text and done.output_tokens == 4
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "not-claimed"}  # delivered twice


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticketed_turns_claim_waits_until_its_request_is_written(rig, model_name, owner, monkeypatch):
    """Begun at once, the claim's ORM work held the GIL while the loop connected and wrote the request. Here the
    backend's word that the request is written is held back 0.1 s: the claim begins after it, and the turn runs. (The
    reply is long enough that its end, which also releases the claim, comes later.)"""
    turn, tickets = _handed_out(
        monkeypatch, rig, owner, model_name, "Write a long story about a lighthouse keeper.", 120
    )
    real_open, real_claim = starts.open_stream, claim._turns_claim_ticketed
    said_at: list[float] = []
    claimed_at: list[float] = []

    def open_with_late_word(rig: Any, request: Any, *, on_sent: Any = None) -> Any:
        def late() -> None:
            said_at.append(time.monotonic())
            on_sent()

        loop = asyncio.get_running_loop()
        return real_open(rig, request, on_sent=lambda: loop.call_later(0.1, late))

    def timed_claim(**kwargs: Any) -> Any:
        claimed_at.append(time.monotonic())
        return real_claim(**kwargs)

    monkeypatch.setattr(starts, "open_stream", open_with_late_word)
    monkeypatch.setattr(claim, "_turns_claim_ticketed", timed_claim)
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "ran"}
    assert len(said_at) == 1 and claimed_at[0] >= said_at[0], "the claim began before the request was written"
    done = Turn.objects.get(pk=turn.pk)
    assert (done.status, done.output_tokens) == (Turn.Status.DONE, 120), (done.status, done.error)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim_delay_s", [0.3, 2.0])
def test_tokens_read_before_the_claim_are_published_whole_and_in_order_once_it_comes(
    rig, model_name, owner, monkeypatch, claim_delay_s
):
    """A ticketed request's stream is read from the moment it is sent; what comes before the claim (the first tokens,
    or at 2 s the whole short reply and its end) is kept, then published at once when the turn is claimed, and the
    batches that follow carry on from it: every seq once, in order, and the text equal to the stored reply."""

    turn, tickets = _handed_out(monkeypatch, rig, owner, model_name, "Name three colours.", 24)
    real_claim, real_flush = claim._turns_claim_ticketed, turn_stream.TurnStream.flush
    sent: list[tuple[int, int, str]] = []

    def late_claim(**kwargs: Any) -> Any:
        time.sleep(claim_delay_s)
        return real_claim(**kwargs)

    async def recording_flush(self: Any) -> None:
        seq, text = self.seq_sent, "".join(self.pending)
        await real_flush(self)
        if self.seq_sent > seq:
            sent.append((seq + 1, self.seq_sent, text))

    monkeypatch.setattr(claim, "_turns_claim_ticketed", late_claim)
    monkeypatch.setattr(turn_stream.TurnStream, "flush", recording_flush)
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "ran"}
    done = Turn.objects.get(pk=turn.pk)
    assert done.status == Turn.Status.DONE, done.error
    assert sent and sent[0][0] == 1
    assert all(later[0] == earlier[1] + 1 for earlier, later in itertools.pairwise(sent))
    assert "".join(text for _, _, text in sent) == done.reply_text
    assert sent[-1][1] == done.stats["output_events"]


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticketed_request_that_cannot_be_sent_does_not_hold_its_claim(rig, model_name, owner, monkeypatch):
    """Nothing listens where this process last saw the rig: the request fails at once, and the claim goes ahead
    then rather than after ``SENT_WAIT_S`` (the bound for a rig that does not answer at all)."""
    turn, tickets = _handed_out(monkeypatch, rig, owner, model_name, "Count from one to fifty, in words.", 2)
    monkeypatch.setitem(starts._rigs_seen, rig.pk, (rig.kind, "http://127.0.0.1:9", ""))
    monkeypatch.setattr(starts, "SENT_WAIT_S", 5.0)
    began = time.monotonic()
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "ran"}  # sent again where the rig is
    assert time.monotonic() - began < 5.0
    assert Turn.objects.get(pk=turn.pk).output_tokens == 2


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticketed_turn_cancelled_before_its_claim_has_its_request_closed_and_publishes_nothing(
    rig, model_name, owner, monkeypatch
):
    turn, tickets = _handed_out(monkeypatch, rig, owner, model_name, "Count to a hundred.", 200)
    real_claim = claim._turns_claim_ticketed

    def cancel_then_claim(**kwargs: Any) -> Any:
        wait_until(lambda: llama_busy_slots(rig.base_url) > 0, timeout_s=10, what="the request in a slot")
        lifecycle.turn_cancel(turn=Turn.objects.get(pk=turn.pk))  # the user pressed Stop while it was handed out
        return real_claim(**kwargs)

    monkeypatch.setattr(claim, "_turns_claim_ticketed", cancel_then_claim)
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "not-claimed"}
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.CANCELLED
    assert live.snapshot(turn.pk).seq == 0  # no batch of its reached the live list (or its page)
    wait_until(lambda: llama_busy_slots(rig.base_url) == 0, timeout_s=10, what="llama-server to drop the request")


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticketed_turn_on_a_rig_that_moved_is_sent_again_where_the_rig_is_now(rig, model_name, owner, monkeypatch):
    """The process last saw the rig elsewhere (an admin changed its address since): the early request fails or
    goes to the wrong place, and the claim's read of the rig sends it again to the right one."""
    turn, tickets = _handed_out(monkeypatch, rig, owner, model_name, "Count from one to fifty, in words.", 3)
    monkeypatch.setitem(starts._rigs_seen, rig.pk, (rig.kind, "http://127.0.0.1:9", ""))  # nothing listens there
    assert starts.turns_run([turn.pk], tickets=tickets) == {turn.pk: "ran"}
    done = Turn.objects.get(pk=turn.pk)
    assert (done.status, done.output_tokens) == (Turn.Status.DONE, 3), (done.status, done.error)
    assert starts._rigs_seen[rig.pk] == (rig.kind, rig.base_url, rig.api_key)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_ticket_is_not_needed_a_turn_without_one_or_with_a_broken_one_starts_from_a_read(
    rig, model_name, owner, monkeypatch
):
    turn, _ = _handed_out(monkeypatch, rig, owner, model_name, "Count from one to fifty, in words.", 2)
    assert starts.turns_run([turn.pk], tickets=[{"turn_id": turn.pk, "model": 5}]) == {turn.pk: "ran"}
    done = Turn.objects.get(pk=turn.pk)
    assert (done.status, done.token_cap, done.output_tokens) == (Turn.Status.DONE, 2, 2)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("early", [True, False], ids=["request-before-claim", "rig-not-seen-yet"])
def test_a_ticket_that_says_otherwise_than_the_stored_turn_fails_it_instead_of_running_another_prompt(
    rig, model_name, owner, monkeypatch, early
):
    """A message changed on its way through the broker (or a bug in building tickets): the claim's read of the turn
    disagrees with the ticket, any early request is closed, and the turn fails saying so; no text is stored."""
    turn, [forged] = _handed_out(monkeypatch, rig, owner, model_name, "Say hello.", 8)
    forged["messages"][-1]["content"] = "Write a poem about something else."
    if not early:
        monkeypatch.delitem(starts._rigs_seen, rig.pk)
    assert starts.turns_run([turn.pk], tickets=[forged]) == {turn.pk: "ran"}
    failed = Turn.objects.get(pk=turn.pk)
    assert (failed.status, failed.finish_reason, failed.reply_text) == (Turn.Status.FAILED, "ticket_mismatch", "")
    assert "did not match" in failed.error
    assert live.snapshot(turn.pk).seq == 0
    redis.Redis.from_url(_broker_url()).delete(rig.queue)
