"""The early lane (inference/queue/early.py, inference/worker/early.py): an API request's backend request goes out
while its turn is stored, and the database still decides whether it is used.

The first tests read what the web process sends (the lane's list and the Celery message, in the real Redis); the
worker is then the test calling the worker's functions, as in tests/test_tickets.py, against the real llama-server;
the last test runs the suite's real Celery worker.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from inference.board import apikeys
from inference.errors import QuotaExceeded
from inference.live import state as live
from inference.models import Quota, Rig, Turn
from inference.queue import early
from inference.queue.tickets import StartTicket, ticket_from_message
from inference.turns import submit
from inference.turns.api import api_turn_submit
from inference.views.openai_request import chat_request_parse
from inference.worker import early as worker_early
from inference.worker import loop
from inference.worker import start as starts
from tests.adminkit import make_session, make_user, quiet
from tests.conftest import llama_busy_slots, wait_until


def _broker() -> redis.Redis:
    return redis.Redis.from_url(str(settings.CELERY_BROKER_URL))


def _lane(queue: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in live.sync_client().lrange(early.lane_key(queue), 0, -1)]


def _control(early_id: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in live.sync_client().lrange(early.control_key(early_id), 0, -1)]


def _task_tickets(queue: str) -> list[dict[str, Any]]:
    import base64

    raws = reversed(_broker().lrange(queue, 0, -1))
    return [t for raw in raws for t in json.loads(base64.b64decode(json.loads(raw)["body"]))[1].get("tickets", [])]


def _clear(rig: Rig) -> None:
    live.sync_client().delete(early.lane_key(rig.queue), early.open_slots_key(rig.pk))
    _broker().delete(rig.queue)


def _request(key: Any, rig: Rig, body: dict[str, Any]) -> Turn:
    """What the /v1/chat/completions view does with a body, past its key check and model lookup."""
    parsed = chat_request_parse(json.dumps({"model": "m", **body}).encode())
    model = rig.models_served[0] if rig.models_served else "m"
    return api_turn_submit(key=key, rig=rig, model=model, history=parsed.history, text=parsed.user_text,
                           params=parsed.params, client="tests")  # fmt: skip


@pytest.fixture
def dead_rig(db: Any) -> Rig:
    rig = Rig.objects.create(name="r", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.e", slots=2)
    quiet(rig)
    _clear(rig)
    yield rig
    _clear(rig)


@pytest.mark.django_db(transaction=True)
def test_each_dispatch_keeps_the_rigs_open_slots_and_a_rig_behind_an_agent_has_none(dead_rig):
    owner = make_user("owner")
    open_slots = early.open_slots_key(dead_rig.pk)
    for expected in ("1", "0", "0"):  # the third waits: still none open
        [turn] = submit.turn_submit_many([submit.SubmitRequest(owner, make_session(owner, dead_rig, "m").pk, "hi")])
        assert isinstance(turn, Turn)
        assert live.sync_client().get(open_slots) == expected.encode()
    agent_rig = Rig.objects.create(name="a", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.a",
                                   slots=4, agent_key="k" * 40)  # fmt: skip
    live.sync_client().set(early.open_slots_key(agent_rig.pk), 3)
    from inference.queue import dispatch

    dispatch.rig_dispatch(rig_id=agent_rig.pk)
    assert live.sync_client().get(early.open_slots_key(agent_rig.pk)) == b"0"


def _ticket(rig_id: int) -> StartTicket:
    return StartTicket(turn_id=0, rig_id=rig_id, model="m", messages=[{"role": "user", "content": "hi"}], params={},
                       max_tokens=8, context_limit=None)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_an_early_ticket_takes_an_open_slot_and_none_goes_without_one(dead_rig):
    early.open_slots_set(dead_rig.pk, 1)
    first = early.offer(key_id=1, queue=dead_rig.queue, ticket=_ticket(dead_rig.pk))
    assert first is not None
    assert early.offer(key_id=1, queue=dead_rig.queue, ticket=_ticket(dead_rig.pk)) is None
    [message] = _lane(dead_rig.queue)
    assert message["id"] == first.id and ticket_from_message(message["ticket"]) == _ticket(dead_rig.pk)
    assert live.sync_client().get(early.open_slots_key(dead_rig.pk)) == b"0"


@pytest.mark.django_db(transaction=True)
def test_with_the_early_lane_off_an_api_request_sends_no_early_ticket(dead_rig, settings):
    settings.RIGDASH_EARLY_LANE = False
    key = apikeys.api_key_create(owner=make_user("owner"), name="tool").key
    early.open_slots_set(dead_rig.pk, 2)
    _request(key, dead_rig, {"messages": [{"role": "user", "content": "hi"}]})
    assert _lane(dead_rig.queue) == []
    [task_ticket] = _task_tickets(dead_rig.queue)
    assert task_ticket["early"] == ""


BODIES = {
    "plain": {"messages": [{"role": "user", "content": "hi"}]},
    "samplers and history": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        "temperature": 0,
        "seed": 3,
        "stop": ["\n\n"],
        "top_k": 5,
        "max_tokens": 7,
    },
    "tools and json": {
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "presence_penalty": 0.5,
    },
    "a tool's result last": {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    },
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_an_api_request_sends_an_early_ticket_that_its_turns_task_names_and_the_worker_takes(dead_rig, body):
    """The web process's guess of the start ticket is the submit's own ticket for every kind of request: the worker
    takes the held request for it (``take`` compares them), so the early lane is never wasted on a plain request."""
    key = apikeys.api_key_create(owner=make_user("owner"), name="tool").key
    early.open_slots_set(dead_rig.pk, 2)
    turn = _request(key, dead_rig, body)
    [offer] = _lane(dead_rig.queue)
    [task_ticket] = _task_tickets(dead_rig.queue)
    assert task_ticket["turn_id"] == turn.pk and task_ticket["early"] == offer["id"]
    assert _control(offer["id"]) == [{"confirm": task_ticket}]  # after the commit, for the process holding it
    held = _hold(offer)
    assert worker_early.take(ticket_from_message(task_ticket)) is held
    assert not held.claim.done()  # left to the claim
    assert live.sync_client().get(early.open_slots_key(dead_rig.pk)) == b"1"  # the dispatch's count, after the commit


@pytest.mark.django_db(transaction=True)
def test_the_early_requests_confirmation_goes_out_before_the_turns_task(dead_rig, monkeypatch):
    """The holder claims the turn on the confirmation: sending the Celery task first would put it on the first token's
    way."""
    from inference.tasks import turns_run_task

    key = apikeys.api_key_create(owner=make_user("owner"), name="tool").key
    early.open_slots_set(dead_rig.pk, 2)
    real_send = turns_run_task.apply_async
    words_at_send: list[list[dict[str, Any]]] = []

    def send(*args: Any, **kwargs: Any) -> Any:
        [offer] = _lane(dead_rig.queue)
        words_at_send.append(_control(offer["id"]))
        return real_send(*args, **kwargs)

    monkeypatch.setattr(turns_run_task, "apply_async", send)
    turn = _request(key, dead_rig, BODIES["plain"])
    [task_ticket] = _task_tickets(dead_rig.queue)
    assert task_ticket["turn_id"] == turn.pk and words_at_send == [[{"confirm": task_ticket}]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_early", [True, False], ids=["confirmed to its holder", "no early request"])
def test_a_task_the_broker_refuses_leaves_a_confirmed_turn_to_its_early_requests_holder(dead_rig, broker_down,
                                                                                        with_early):  # fmt: skip
    """The broker refuses the task (mocked: ``broker_down``). A turn confirmed to the worker holding its early request
    stays handed out and the request is answered (the holder claims it); without an early request it is refused with
    QueueUnavailable and waits, as a chat's turn does (tests/test_submits.py)."""
    from inference.errors import QueueUnavailable
    from inference.worker import claim as claims

    key = apikeys.api_key_create(owner=make_user("owner"), name="tool").key
    early.open_slots_set(dead_rig.pk, 2 if with_early else 0)
    if not with_early:
        with pytest.raises(QueueUnavailable):
            _request(key, dead_rig, BODIES["plain"])
        [turn] = Turn.objects.all()
        assert (turn.status, turn.dispatched_at) == (Turn.Status.QUEUED, None)
        return
    turn = _request(key, dead_rig, BODIES["plain"])
    [offer] = _lane(dead_rig.queue)
    [word] = _control(offer["id"])
    ticket = ticket_from_message(word["confirm"])
    assert ticket is not None and ticket.turn_id == turn.pk and ticket.early == offer["id"]
    turn.refresh_from_db()
    assert turn.status == Turn.Status.QUEUED and turn.dispatched_at is not None  # handed out, to the holder
    claimed = claims.turns_start(turn_ids=[turn.pk], worker="holder", tickets={turn.pk: ticket}, rig_id=dead_rig.pk)
    assert claimed[turn.pk] is not None and Turn.objects.get(pk=turn.pk).worker == "holder"


def _hold(offer: dict[str, Any]) -> worker_early.Held:
    """The worker's hold of an offer, with no request behind it (the ticket comparison alone)."""
    ticket = ticket_from_message(offer["ticket"])
    assert ticket is not None
    held = worker_early.Held(ticket=ticket, claim=concurrent.futures.Future(), run=concurrent.futures.Future())
    worker_early._held[offer["id"]] = held
    return held


@pytest.mark.django_db(transaction=True)
def test_an_owners_per_reply_limit_the_web_did_not_know_withdraws_the_early_ticket(dead_rig):
    """The early ticket asked for the server's reply cap; the owner's limit is lower: the turn's ticket does not name
    it, the submit withdraws it, and the worker would not take it either."""
    owner = make_user("owner")
    Quota.objects.create(user=owner, max_tokens_per_reply=5)
    key = apikeys.api_key_create(owner=owner, name="tool").key
    early.open_slots_set(dead_rig.pk, 2)
    _request(key, dead_rig, BODIES["plain"])  # no max_tokens: the reply's cap is the owner's 5
    [offer] = _lane(dead_rig.queue)
    assert _control(offer["id"]) == [{"withdraw": True}]
    [task_ticket] = _task_tickets(dead_rig.queue)
    assert (task_ticket["max_tokens"], task_ticket["early"]) == (5, "")
    assert offer["ticket"]["max_tokens"] == settings.RIGDASH.max_reply_tokens
    held = _hold(offer)
    assert worker_early.take(ticket_from_message({**task_ticket, "early": offer["id"]})) is None
    assert held.claim.result(timeout=0) is None  # closed: the turn starts from its own ticket
    assert offer["id"] not in worker_early._held
    early._paused_until.pop(key.pk)


@pytest.mark.django_db(transaction=True)
def test_a_refused_request_withdraws_its_early_ticket_and_its_key_waits_for_the_database_next_time(dead_rig):
    owner = make_user("owner")
    quota = Quota.objects.create(user=owner, max_concurrent_turns=0)
    key = apikeys.api_key_create(owner=owner, name="tool").key
    early.open_slots_set(dead_rig.pk, 2)
    with pytest.raises(QuotaExceeded):
        _request(key, dead_rig, BODIES["plain"])
    [offer] = _lane(dead_rig.queue)
    assert _control(offer["id"]) == [{"withdraw": True}]
    assert Turn.objects.count() == 0
    quota.delete()
    early.open_slots_set(dead_rig.pk, 2)
    _request(key, dead_rig, BODIES["plain"])  # accepted, but with no early ticket for a while
    assert len(_lane(dead_rig.queue)) == 1
    [task_ticket] = _task_tickets(dead_rig.queue)
    assert task_ticket["early"] == ""
    early._paused_until.pop(key.pk)


@pytest.mark.django_db(transaction=True)
def test_a_request_that_must_wait_withdraws_its_early_ticket(dead_rig):
    """The open-slot count said a slot was free (stale: a chat page's turn took it since), the dispatch says wait."""
    owner = make_user("owner")
    dead_rig.slots = 1
    dead_rig.save(update_fields=["slots"])
    submit.turn_submit_many([submit.SubmitRequest(owner, make_session(owner, dead_rig, "m").pk, "hi")])
    early.open_slots_set(dead_rig.pk, 1)
    key = apikeys.api_key_create(owner=owner, name="tool").key
    turn = _request(key, dead_rig, BODIES["plain"])
    [offer] = _lane(dead_rig.queue)
    assert _control(offer["id"]) == [{"withdraw": True}]
    assert Turn.objects.get(pk=turn.pk).dispatched_at is None  # waiting
    assert live.sync_client().get(early.open_slots_key(dead_rig.pk)) == b"0"
    early._paused_until.pop(key.pk)


# The worker's end, against the real llama-server ----------------------------------------------------------------


@pytest.fixture
def live_rig(rig: Rig, model_name: str, monkeypatch: Any) -> Rig:
    """The suite's llama-server rig, on a queue no worker reads (the test is the worker), seen by this process."""
    quiet(rig)
    rig.models_served = [model_name]
    rig.save(update_fields=["models_served"])
    _clear(rig)
    monkeypatch.setitem(starts._rigs_seen, rig.pk, (rig.kind, rig.base_url, rig.api_key))
    yield rig
    _clear(rig)


def _accept(raw: dict[str, Any]) -> None:
    async def accept() -> None:
        worker_early.accept(json.dumps(raw), starts.early_send, starts.early_claim)

    loop.run(accept())


def _tasks_before(url: str) -> dict[int, Any]:
    return {slot["id"]: slot.get("id_task") for slot in httpx.get(f"{url}/slots").json()}


COUNT = {"messages": [{"role": "user", "content": "Count from one to twenty, in words."}], "temperature": 0,
         "seed": 1, "max_tokens": 24}  # fmt: skip


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_an_early_request_reaches_the_backend_before_the_turn_is_stored_and_its_turn_uses_it(live_rig, owner):
    """Same reply as the turn started the ordinary way, and the stats say how its request was sent."""
    key = apikeys.api_key_create(owner=owner, name="tool").key
    plain = _request(key, live_rig, COUNT)  # no open slots known yet: no early ticket
    [ticket] = _task_tickets(live_rig.queue)
    _broker().delete(live_rig.queue)
    assert ticket["early"] == "" and starts.turns_run([plain.pk], tickets=[ticket]) == {plain.pk: "ran"}

    early.open_slots_set(live_rig.pk, 2)
    before = _tasks_before(live_rig.base_url)
    submitted: list[Turn] = []
    real_submit = submit.turn_submit

    def submit_once_the_backend_has_it(**kwargs: Any) -> Turn:
        [offer] = _lane(live_rig.queue)
        _accept(offer)  # the worker takes it from the lane while the web process stores the turn
        wait_until(lambda: _tasks_before(live_rig.base_url) != before, timeout_s=10, what="the request in a slot")
        submitted.append(real_submit(**kwargs))
        return submitted[-1]

    import inference.turns.api as api_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api_module, "turn_submit", submit_once_the_backend_has_it)
        turn = _request(key, live_rig, COUNT)
    # The commit's confirmation reaches this process, which holds the request: it claims and runs the turn with no
    # task at all. The task, delivered after, finds it claimed and sends the backend nothing.
    wait_until(lambda: Turn.objects.get(pk=turn.pk).status == Turn.Status.DONE, timeout_s=60, what="the reply")
    [ticket] = _task_tickets(live_rig.queue)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(starts, "open_stream", lambda *_, **__: pytest.fail("the task sent a second request"))
        assert starts.turns_run([turn.pk], tickets=[ticket]) == {turn.pk: "not-claimed"}
    first, second = Turn.objects.get(pk=plain.pk), Turn.objects.get(pk=turn.pk)
    assert second.status == Turn.Status.DONE, second.error
    assert (first.stats["request_sent_by"], second.stats["request_sent_by"]) == ("ticket", "early lane")
    assert second.reply_text == first.reply_text and second.output_tokens == first.output_tokens == 24


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["withdrawn", "held too long"])
def test_an_early_request_no_turn_takes_is_closed_and_publishes_nothing(live_rig, monkeypatch, how):
    monkeypatch.setattr(worker_early, "HOLD_S", 0.5)
    offer = {"id": f"e-{how}", "at": time.time(), "ticket": _ticket(live_rig.pk).as_message()}
    offer["ticket"].update(model=live_rig.models_served[0], max_tokens=400,
                           messages=COUNT["messages"])  # fmt: skip
    _accept(offer)
    wait_until(lambda: llama_busy_slots(live_rig.base_url) > 0, timeout_s=10, what="the request in a slot")
    held = worker_early._held[offer["id"]]
    if how == "withdrawn":
        live.sync_client().rpush(early.control_key(offer["id"]), json.dumps({"withdraw": True}))
    held.run.result(timeout=10)
    assert held.claim.result() is None and offer["id"] not in worker_early._held
    wait_until(lambda: llama_busy_slots(live_rig.base_url) == 0, timeout_s=10, what="llama-server to drop it")


@pytest.mark.django_db(transaction=True)
def test_a_stale_or_broken_lane_message_starts_nothing(dead_rig, monkeypatch):
    monkeypatch.setitem(starts._rigs_seen, dead_rig.pk, (dead_rig.kind, dead_rig.base_url, ""))
    sent: list[Any] = []

    def send(ticket: StartTicket) -> None:
        sent.append(ticket)

    def claim(ticket: StartTicket) -> Any:
        raise AssertionError("nothing to claim")

    async def accept_all() -> None:
        for raw in (
            json.dumps({"id": "old", "at": time.time() - 5, "ticket": _ticket(dead_rig.pk).as_message()}),
            json.dumps({"id": "bad", "at": time.time(), "ticket": {"turn_id": "x"}}),
            "not json",
            json.dumps(["a list"]),
            json.dumps({"withdraw": True}),
        ):
            worker_early.accept(raw, send, claim)

    loop.run(accept_all())
    assert sent == [] and worker_early._held == {}


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_suites_worker_takes_an_api_requests_early_ticket(rig, owner, model_name, celery_worker):
    """The running worker listens to its rig queues' lanes (rigdash/celery.py): after a first turn on the rig (the
    worker has seen it), an API request's backend request is sent by the early lane."""
    _clear(rig)
    key = apikeys.api_key_create(owner=owner, name="tool").key
    rig.models_served = [model_name]
    rig.save(update_fields=["models_served"])
    turns = []
    for _ in range(3):
        turns.append(_request(key, rig, COUNT))
        wait_until(lambda: Turn.objects.get(pk=turns[-1].pk).status == Turn.Status.DONE, timeout_s=60,
                   what="the reply")  # fmt: skip
    sent_by = [Turn.objects.get(pk=t.pk).stats["request_sent_by"] for t in turns]
    assert sent_by[0] in ("ticket", "claim") and sent_by[-1] == "early lane", sent_by
    assert len({Turn.objects.get(pk=t.pk).reply_text for t in turns}) == 1


# A key from memory: the web process sends a known key's early request before reading anything from the database,
# and the key's row still decides before anything is stored or answered (inference/board/apikeys.py).


def _view_request(path: str, key_secret: str, body: dict[str, Any], header: str = "Authorization") -> Any:
    from django.test import RequestFactory

    value = key_secret if header == "X-Api-Key" else f"Bearer {key_secret}"
    return RequestFactory().post(path, data=json.dumps(body), content_type="application/json",
                                 headers={header: value, "User-Agent": "tests"})  # fmt: skip


def _served(rig: Rig) -> None:
    from inference.backends.base import ModelInfo
    from inference.live import served

    served.served_store(rig.pk, [ModelInfo("m", context_length=2048)])
    Rig.objects.filter(pk=rig.pk).update(models_served=["m"])


@pytest.mark.django_db(transaction=True)
def test_a_remembered_key_sends_its_early_request_before_any_database_read_and_the_turn_uses_it(dead_rig):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inference.views.openai_chat import authenticated_submit

    _served(dead_rig)
    new = apikeys.api_key_create(owner=make_user("owner"), name="tool")
    early.open_slots_set(dead_rig.pk, 2)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    first = authenticated_submit(_view_request("/v1/chat/completions", new.secret, body))  # read: now remembered
    assert isinstance(first, tuple)
    offered_after: list[int] = []
    offer = early.offer

    def spy(**kwargs: Any) -> early.EarlyStart | None:
        offered_after.append(len(queries.captured_queries))
        return offer(**kwargs)

    early.open_slots_set(dead_rig.pk, 2)
    with CaptureQueriesContext(connection) as queries, pytest.MonkeyPatch.context() as patch:
        patch.setattr(early, "offer", spy)
        second = authenticated_submit(_view_request("/v1/chat/completions", new.secret, body))
    assert isinstance(second, tuple)
    assert offered_after == [0]  # the early request went out before the key's row or the rigs were read
    offers = _lane(dead_rig.queue)
    second_ticket = next(t for t in _task_tickets(dead_rig.queue) if t["turn_id"] == second[0].pk)
    assert second_ticket["early"] == offers[-1]["id"]  # and the stored turn's ticket names it
    assert _control(offers[-1]["id"]) == [{"confirm": second_ticket}]


def _anthropic_body() -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


SUBMITS = {
    "openai": ("/v1/chat/completions", "Authorization",
               {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "ollama": ("/api/chat", "Authorization", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "anthropic": ("/v1/messages", "X-Api-Key", _anthropic_body()),
}  # fmt: skip


def _submit_view(api: str) -> Any:
    if api == "openai":
        from inference.views.openai_chat import authenticated_submit

        return authenticated_submit
    if api == "ollama":
        from inference.views import ollama_api

        return ollama_api._key_view(ollama_api._chat_submit, submits=True)
    from inference.views import anthropic_messages

    return anthropic_messages._submit


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("api", SUBMITS)
@pytest.mark.parametrize("change", ["revoked", "owner deactivated"])
@pytest.mark.parametrize("body_change", ["none", "unknown model", "bad body"])
def test_a_remembered_key_revoked_since_is_refused_and_its_early_request_withdrawn(dead_rig, api, change,
                                                                                   body_change):  # fmt: skip
    """Whatever the request (one that would be stored, or refused for its model or body), a key refused since this
    process remembered it gets the 401 in the API's shape: no turn, no other answer, its early request withdrawn."""
    _served(dead_rig)
    owner = make_user("owner")
    new = apikeys.api_key_create(owner=owner, name="tool")
    path, header, body = SUBMITS[api]
    view = _submit_view(api)
    early.open_slots_set(dead_rig.pk, 2)
    assert isinstance(view(_view_request(path, new.secret, body, header)), tuple)  # remembered
    if change == "revoked":
        apikeys.api_key_revoke(key_id=new.key.pk, actor=owner)
    else:
        type(owner).objects.filter(pk=owner.pk).update(is_active=False)  # a QuerySet update: no signal
    early._paused_until.clear()
    early.open_slots_set(dead_rig.pk, 2)
    lane_before = len(_lane(dead_rig.queue))
    turns_before = Turn.objects.count()
    if body_change == "unknown model":
        body = {**body, "model": "nope"}
    elif body_change == "bad body":
        body = {**body, "messages": "not a list"}
    answer = view(_view_request(path, new.secret, body, header))
    assert not isinstance(answer, tuple) and answer.status_code == 401
    said = json.loads(answer.content)
    assert ("revoked" if change == "revoked" else "deactivated") in json.dumps(said)
    assert {"openai": "error", "ollama": "error", "anthropic": "type"}[api] in said
    assert Turn.objects.count() == turns_before
    offers = _lane(dead_rig.queue)[lane_before:]
    assert len(offers) == (1 if body_change == "none" else 0)  # only a request with a known model was guessed
    for offer in offers:
        assert _control(offer["id"]) == [{"withdraw": True}]
    # Refused once, the key is no longer remembered: the next request reads its row first, and sends nothing.
    assert view(_view_request(path, new.secret, SUBMITS[api][2], header)).status_code == 401
    assert len(_lane(dead_rig.queue)) == lane_before + len(offers)


@pytest.mark.django_db(transaction=True)
def test_a_nul_character_in_a_request_is_stored_as_the_replacement_character(dead_rig):
    """PostgreSQL stores no NUL (U+0000) in text or jsonb: an API request's messages, a chat page's message and its
    params holding one are stored with U+FFFD, not refused with a database error (a 500)."""
    from inference.views.openai_chat import authenticated_submit

    _served(dead_rig)
    owner = make_user("owner")
    new = apikeys.api_key_create(owner=owner, name="tool")
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "s\u0000"}, {"role": "user", "content": "h\u0000i"}],
    }
    submitted = authenticated_submit(_view_request("/v1/chat/completions", new.secret, body))
    assert isinstance(submitted, tuple)
    turn = Turn.objects.select_related("session").get(pk=submitted[0].pk)
    assert turn.user_text == "h\ufffdi" and turn.session.context_messages == [{"role": "system", "content": "s\ufffd"}]
    [chat_turn] = submit.turn_submit_many(
        [submit.SubmitRequest(owner, make_session(owner, dead_rig, "m").pk, "a\u0000b", {"system": "x\u0000"})]
    )
    assert isinstance(chat_turn, Turn)
    chat_turn.refresh_from_db()
    assert chat_turn.user_text == "a\ufffdb" and "\u0000" not in json.dumps(chat_turn.params)
