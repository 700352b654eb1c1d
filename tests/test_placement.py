"""Placement: a chat that targets a model has each turn run on an enabled rig serving it, the one with a free slot
and the shortest queue; the fair queue spans those rigs; the chat and the board say which rig ran each turn.

The dispatch tests point rigs at Celery queues no worker listens to (the turns are handed out, never run). The last
test runs two real llama-servers, each with its own rig agent serving its queue, as two hosts would."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from inference import events
from inference.errors import InvalidInput
from inference.live import agents
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch, placement
from inference.turns import board_rows, lifecycle, selectors, sessions, submit
from inference.worker import claim
from tests.adminkit import make_user
from tests.conftest import wait_until
from tests.test_agents import KEY_A, KEY_B, _start_agent

MODEL = "smollm2"


def _rig(name: str, *, slots: int = 1, models: tuple[str, ...] = (MODEL,), **extra: Any) -> Rig:
    return Rig.objects.create(
        name=name,
        kind=Rig.Kind.LLAMACPP,
        base_url="http://127.0.0.1:9",
        queue=f"rig.nobody-listens.{name}",  # handed out, never run
        slots=slots,
        models_served=list(models),
        **extra,
    )


def _placed_chat(user: Any, model: str = MODEL) -> ChatSession:
    return sessions.session_create_placed(owner=user, model_name=model)


def _end(turn: Turn) -> None:
    """The turn's worker finished it: its slot goes to the next waiting turn."""
    turn.refresh_from_db()
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DONE, finished_at=timezone.now())
    lifecycle.turn_released(turn_id=turn.pk, rig_id=turn.rig_id)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], str, list[Any]]]:
    """The Celery messages dispatch sends: (turn ids, queue, tickets). Sent for real, and recorded."""
    calls: list[tuple[list[int], str, list[Any]]] = []
    real = dispatch._send

    def record(turn_ids: list[int], queue: str, tickets: Any = (), **kwargs: Any) -> None:
        if turn_ids:
            calls.append((list(turn_ids), queue, list(tickets)))
        real(turn_ids, queue, tickets, **kwargs)

    monkeypatch.setattr(dispatch, "_send", record)
    return calls


@pytest.mark.django_db(transaction=True)
def test_placed_turns_go_to_the_rig_with_a_free_slot_and_the_chat_follows(sent: list[Any]) -> None:
    rig_a, rig_b = _rig("place-a"), _rig("place-b")
    _rig("place-other", models=("another-model",))  # serves something else: never takes these turns
    users = [make_user(f"placed{i}") for i in range(3)]
    chats = [_placed_chat(user) for user in users]
    assert all(chat.rig_id == rig_a.pk and chat.placement == ChatSession.Placement.MODEL for chat in chats)

    first = submit.turn_submit(session=chats[0], text="one")
    second = submit.turn_submit(session=chats[1], text="two")
    third = submit.turn_submit(session=chats[2], text="three")
    rigs = {t.pk: Turn.objects.get(pk=t.pk).rig_id for t in (first, second, third)}
    # One each on the two free slots; the third waits for whichever frees first.
    assert (rigs[first.pk], rigs[second.pk], rigs[third.pk]) == (rig_a.pk, rig_b.pk, None)
    assert [(ids, queue) for ids, queue, _ in sent] == [([first.pk], rig_a.queue), ([second.pk], rig_b.queue)]
    # The ticket of the turn that went to B names B: the worker's claim checks it against the chat's rig.
    assert [ticket.rig_id for ticket in sent[1][2]] == [rig_b.pk]
    assert ChatSession.objects.get(pk=chats[1].pk).rig_id == rig_b.pk  # the chat moved with its turn
    assert dispatch.queue_position(Turn.objects.get(pk=third.pk)) == 1

    _end(second)  # B frees first: the waiting turn goes there, not to A
    third = Turn.objects.get(pk=third.pk)
    assert (third.rig_id, third.dispatched_at is not None) == (rig_b.pk, True)
    assert ChatSession.objects.get(pk=chats[2].pk).rig_id == rig_b.pk
    assert selectors.turn_snapshot(third)["rig"] == "place-b"


@pytest.mark.django_db(transaction=True)
def test_a_rig_holding_the_model_in_memory_comes_first_then_one_that_cannot_say(sent: list[Any]) -> None:
    """What the sampler keeps of each rig's loaded models (inference/live/served.py): a rig that would have to load
    the model first loses to one that holds it, even with more free slots; a rig whose server cannot say (an
    OpenAI-compatible one, or no sampler) ranks between the two."""
    from inference.live import served

    cold, warm, unknown = _rig("cold", slots=4), _rig("warm", slots=1), _rig("unknown", slots=4)
    served.loaded_store(cold.pk, ["another-model"])
    served.loaded_store(warm.pk, [MODEL])
    served.loaded_store(unknown.pk, None)
    assert placement.choose([cold, warm, unknown], model=MODEL) == warm
    assert placement.choose([cold, unknown], model=MODEL) == unknown
    assert placement.choose([cold, warm, unknown]) == cold  # no model named: slots decide, as before
    turn = submit.turn_submit(session=_placed_chat(make_user("warm-user")), text="hi")
    assert Turn.objects.get(pk=turn.pk).rig_id == warm.pk
    for rig in (cold, warm, unknown):
        served.loaded_store(rig.pk, None)


@pytest.mark.django_db(transaction=True)
def test_a_submit_prefers_the_rig_with_more_free_slots_then_the_shorter_queue(sent: list[Any]) -> None:
    small, big = _rig("small", slots=1), _rig("big", slots=3)
    user = make_user("chooser")
    assert placement.choose([small, big]) == big  # 3 free against 1
    for i in range(2):
        submit.turn_submit(session=_placed_chat(make_user(f"filler{i}")), text="fill")
    # big now runs two (1 free), small none (1 free): equal free slots, small has the shorter queue.
    assert Turn.objects.filter(rig=big).count() == 2
    assert placement.choose([small, big]) == small
    turn = submit.turn_submit(session=_placed_chat(user), text="mine")
    assert Turn.objects.get(pk=turn.pk).rig_id == small.pk


@pytest.mark.django_db(transaction=True)
def test_the_fair_queue_spans_the_rigs_a_placed_turn_may_go_to(sent: list[Any]) -> None:
    """A pinned chat's turns and placed chats' turns wait in one fair queue on the rig they share: a user with a
    burst of placed turns does not go before another user's single pinned turn."""
    shared = _rig("shared", slots=1)
    heavy, light = make_user("heavy"), make_user("light")
    running = submit.turn_submit(session=_placed_chat(heavy), text="first")  # takes the only slot
    burst = [submit.turn_submit(session=_placed_chat(heavy), text=f"burst {i}") for i in range(2)]
    pinned = submit.turn_submit(session=ChatSession.objects.create(owner=light, rig=shared, model_name=MODEL), text="x")
    order = [w.turn_id for w in dispatch.waiting_order(shared.pk)]
    assert order == [pinned.pk, burst[0].pk, burst[1].pk]
    _end(running)
    assert Turn.objects.get(pk=pinned.pk).dispatched_at is not None  # light's turn went first
    rows = {row["id"]: row for row in board_rows.board_rows()}
    assert rows[pinned.pk]["queue_position"] == 0 and rows[burst[0].pk]["queue_position"] == 1
    assert rows[burst[0].pk]["placed"] and not rows[pinned.pk]["placed"]
    labels = [rows[turn.pk]["rig"] for turn in (burst[0], pinned, running)]
    assert labels == ["any rig", "shared", "shared"]  # waiting for any rig; the rig that runs it; the one that ran it


@pytest.mark.django_db(transaction=True)
def test_rigs_that_are_disabled_or_do_not_serve_the_model_never_take_placed_turns(sent: list[Any]) -> None:
    off = _rig("off")
    elsewhere = _rig("elsewhere", models=("other",))
    user = make_user("nowhere")
    chat = _placed_chat(user)
    off.enabled = False
    off.save()
    with pytest.raises(InvalidInput) as refused:
        submit.turn_submit(session=chat, text="hello")
    assert refused.value.code == "no_rig_serves_model" and MODEL in refused.value.message
    assert not Turn.objects.exists()  # nothing stored
    with pytest.raises(InvalidInput):
        sessions.session_create_placed(owner=user, model_name="no-such-model")
    with pytest.raises(InvalidInput):
        sessions.session_create_placed(owner=user, model_name="")

    # Enabled again while a turn of another model waits on `elsewhere`: dispatching `elsewhere` leaves it alone.
    off.enabled = True
    off.save()
    turn = submit.turn_submit(session=chat, text="hello")
    assert Turn.objects.get(pk=turn.pk).rig_id == off.pk
    assert dispatch.rig_dispatch(rig_id=elsewhere.pk) == []


@pytest.mark.django_db(transaction=True)
def test_a_placed_turn_waits_while_no_rig_serving_it_has_an_agent_up_then_fails_clearly(
    sent: list[Any], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = _rig("agented", agent_key=KEY_A)
    now = time.time()
    agents.publish(key=KEY_A, rig_id=rig.pk, beat={"ts": now - 600, "host": "gpu-box", "instance": "i1"}, sample=None)
    chat = _placed_chat(make_user("stranded"))
    turn = submit.turn_submit(session=chat, text="hello")
    turn = Turn.objects.get(pk=turn.pk)
    assert turn.rig_id is None and turn.dispatched_at is None and sent == []
    snapshot = selectors.turn_snapshot(turn)
    assert snapshot["queue_position"] == 1 and "agent down since" in snapshot["waiting_reason"]

    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, agent_down_fail_s=0.0)
    ended: list[Any] = []
    monkeypatch.setattr(events, "turn_end_sync", lambda **kw: ended.append(kw))
    assert lifecycle.turns_fail_where_agent_down() == [turn.pk]
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED and turn.finish_reason == "no_rig"
    assert "No rig can run this turn" in turn.error and "agent down" in turn.error
    assert ended and ended[0]["turn"]["status"] == "failed"


def _beat(rig: Rig, key: str, *, age_s: float = 0.0) -> None:
    """The rig's agent's heartbeat, ``age_s`` old (older than RIGDASH_AGENT_TIMEOUT_S: the agent is down)."""
    beat = {"ts": time.time() - age_s, "host": rig.name, "instance": "i1"}
    agents.publish(key=key, rig_id=rig.pk, beat=beat, sample=None)


@pytest.mark.django_db(transaction=True)
def test_a_placed_turn_handed_to_a_rig_whose_agent_dies_goes_to_another_and_the_old_task_cannot_start_it(
    sent: list[Any],
) -> None:
    """The rigs' agents are heartbeats written here (no agent process): the dispatch reads them as it would a real
    agent's. The claims are the worker's own, called as its task would call them."""
    rig_a = _rig("strand-a", slots=2, agent_key=KEY_A)
    rig_b = _rig("strand-b", slots=1, agent_key=KEY_B)
    _beat(rig_a, KEY_A)
    _beat(rig_b, KEY_B)
    owner = make_user("stranded-owner")
    placed = submit.turn_submit(session=_placed_chat(owner), text="placed")
    pinned = submit.turn_submit(session=ChatSession.objects.create(owner=owner, rig=rig_a, model_name=MODEL), text="x")
    assert [Turn.objects.get(pk=t.pk).rig_id for t in (placed, pinned)] == [rig_a.pk, rig_a.pk]
    [old_ticket] = sent[0][2]
    assert (sent[0][0], old_ticket.rig_id) == ([placed.pk], rig_a.pk)

    _beat(rig_a, KEY_A, age_s=600)  # A's agent dies before any worker of A claimed the turns
    passed = dispatch.dispatch_all()
    assert passed["released"] == [placed.pk] and placed.pk in passed["dispatched"]
    moved = Turn.objects.get(pk=placed.pk)
    assert (moved.rig_id, moved.status, moved.dispatched_at is not None) == (rig_b.pk, Turn.Status.QUEUED, True)
    assert ChatSession.objects.get(pk=placed.session_id).rig_id == rig_b.pk
    assert sent[-1][:2] == ([placed.pk], rig_b.queue)
    # The pinned chat's turn can only run on A: it stays handed to A, for A's agent to run when it is back.
    assert Turn.objects.get(pk=pinned.pk).rig_id == rig_a.pk

    # A comes back and its worker takes the task still in A's queue: with its ticket or without, nothing starts.
    assert claim.turns_start(turn_ids=[placed.pk], worker="a", tickets={placed.pk: old_ticket}, rig_id=rig_a.pk) == {
        placed.pk: None
    }
    assert claim.turns_start(turn_ids=[placed.pk], worker="a", rig_id=rig_a.pk) == {placed.pk: None}
    assert Turn.objects.get(pk=placed.pk).status == Turn.Status.QUEUED
    started = claim.turns_start(turn_ids=[placed.pk], worker="b", rig_id=rig_b.pk)[placed.pk]
    assert started is not None and started.turn.rig_id == rig_b.pk
    assert Turn.objects.get(pk=placed.pk).worker == "b"


@pytest.mark.django_db(transaction=True)
def test_a_placed_turn_whose_rig_is_disabled_before_its_claim_waits_for_any_rig(sent: list[Any]) -> None:
    rig_a, rig_b = _rig("gone-a"), _rig("gone-b")
    first = submit.turn_submit(session=_placed_chat(make_user("gone1")), text="one")
    second = submit.turn_submit(session=_placed_chat(make_user("gone2")), text="two")
    assert [Turn.objects.get(pk=t.pk).rig_id for t in (first, second)] == [rig_a.pk, rig_b.pk]
    Rig.objects.filter(pk=rig_a.pk).update(enabled=False)
    assert dispatch.release_stranded() == [first.pk]
    turn = Turn.objects.get(pk=first.pk)
    assert (turn.rig_id, turn.dispatched_at) == (None, None)
    assert dispatch.queue_position(turn) == 1  # next on B, whose slot the second turn holds
    _end(second)
    assert Turn.objects.get(pk=first.pk).rig_id == rig_b.pk


@pytest.mark.django_db(transaction=True)
def test_the_new_chat_page_offers_models_several_rigs_serve_and_refuses_a_bad_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backends are the one thing not run here: each rig's model list is given (no llama-server needed)."""
    from inference.backends.base import ModelInfo

    rig_a, rig_b = _rig("page-a", models=()), _rig("page-b", models=())
    _rig("page-c", models=())
    served = {rig_a.pk: [MODEL, "only-a"], rig_b.pk: [MODEL]}

    def listing(rig: Rig) -> list[ModelInfo]:
        names = served.get(rig.pk, ["c-model"])
        rig.record_models(names)
        return [ModelInfo(name=name) for name in names]

    monkeypatch.setattr(sessions, "rig_models", listing)
    user = make_user("pager")
    client = Client()
    client.force_login(user)
    page = client.get("/").content.decode()
    picker = re.search(r'data-testid="placed-model-picker">(.*?)</select>', page, re.S)
    assert picker is not None
    assert re.findall(r'<option value="([^"]+)"', picker.group(1)) == [MODEL]  # the only model two rigs serve
    assert Rig.objects.get(pk=rig_b.pk).models_served == [MODEL]  # asking refreshed what placement reads

    made = client.post("/sessions/new", {"placement": "model", "model": MODEL})
    assert made.status_code == 302
    chat = ChatSession.objects.get(owner=user)
    assert chat.placement == ChatSession.Placement.MODEL and chat.model_name == MODEL
    assert "any rig serving it" in client.get(made["Location"]).content.decode()

    bad = client.post("/sessions/new", {"placement": "model", "model": "<script>x</script>"})
    assert bad.status_code == 400 and b"No enabled rig serves a model named" in bad.content
    assert b"<script>x</script>" not in bad.content
    assert ChatSession.objects.filter(owner=user).count() == 1


def _tokens_predicted(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(r"^llamacpp:tokens_predicted_total\s+([0-9.e+]+)", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_turns_of_chats_placed_on_a_model_spread_across_two_hosts_agents(
    llama_url: str, second_llama: tuple[str, int], service_env: dict[str, str], model_name: str
) -> None:
    """Two llama-servers stand for two hosts, each with its own rig agent serving its rig's queue (the agent runs the
    Celery worker). Four users' placed chats submit at once: both rigs run turns, and what each rig's llama-server
    counts as generated matches the turns RigDash says ran there."""
    url_b, _ = second_llama
    rig_a = Rig.objects.create(
        name="farm-a", kind=Rig.Kind.LLAMACPP, base_url=llama_url, slots=1, agent_key=KEY_A, models_served=[model_name]
    )
    rig_b = Rig.objects.create(
        name="farm-b", kind=Rig.Kind.LLAMACPP, base_url=url_b, slots=1, agent_key=KEY_B, models_served=[model_name]
    )
    procs = [_start_agent(service_env, rig_a, KEY_A, worker=True), _start_agent(service_env, rig_b, KEY_B, worker=True)]
    try:
        wait_until(
            lambda: all(agents.agent_state(r.pk, r.agent_key).up for r in (rig_a, rig_b)), timeout_s=60, what="agents"
        )
        before = {rig_a.pk: _tokens_predicted(llama_url), rig_b.pk: _tokens_predicted(url_b)}
        chats = [_placed_chat(make_user(f"farmer{i}"), model_name) for i in range(4)]
        turns = [
            submit.turn_submit(session=chat, text="Name a colour.", params={"max_tokens": 16, "seed": 1})
            for chat in chats
        ]

        def all_done() -> bool:
            return not Turn.objects.filter(pk__in=[t.pk for t in turns], status__in=Turn.ACTIVE).exists()

        wait_until(all_done, timeout_s=180, interval_s=0.5, what="the four turns")
        ran = list(Turn.objects.filter(pk__in=[t.pk for t in turns]).values_list("rig_id", "status", "output_tokens"))
        assert all(status == Turn.Status.DONE for _, status, _ in ran), ran
        assert {rig for rig, _, _ in ran} == {rig_a.pk, rig_b.pk}  # spread across both
        for rig, url in ((rig_a, llama_url), (rig_b, url_b)):
            said = sum(tokens or 0 for rig_id, _, tokens in ran if rig_id == rig.pk)
            assert _tokens_predicted(url) - before[rig.pk] == pytest.approx(said, abs=2 * len(ran)), rig.name
        for chat in chats:  # each chat sits on the rig that ran its turn
            chat.refresh_from_db()
            assert chat.rig_id == Turn.objects.get(session=chat).rig_id
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_an_api_request_naming_the_model_is_placed_and_one_naming_rig_and_model_is_pinned(
    sent: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backends' model lists are given (no llama-server needed); the API's own path from the model id to a turn is
    real."""
    from inference.backends.base import ModelInfo
    from inference.board import apikeys
    from inference.turns.api import api_turn_submit
    from inference.views import openai

    rig_a, rig_b = _rig("api-a"), _rig("api-b")
    monkeypatch.setattr(openai, "rig_models", lambda rig: [ModelInfo(name=name) for name in rig.models_served])
    user = make_user("scripted")
    key = apikeys.api_key_create(owner=user, name="editor").key
    catalogue = openai.model_catalogue()
    assert sorted(e.id for e in catalogue) == sorted([MODEL, f"api-a/{MODEL}", f"api-b/{MODEL}"])

    def ask(model_id: str) -> Turn:
        entry = openai.model_resolve(model_id, catalogue)
        assert entry is not None
        turn = api_turn_submit(
            key=key, rig=entry.rig, model=entry.model, history=[], text="hi", params={}, placed=entry.placed
        )
        return Turn.objects.select_related("session").get(pk=turn.pk)

    first, second = ask(MODEL), ask(MODEL)
    assert (first.rig_id, second.rig_id) == (rig_a.pk, rig_b.pk)  # one each: both had a free slot
    assert first.session.placement == ChatSession.Placement.MODEL
    pinned = ask(f"api-a/{MODEL}")  # waits for api-a though api-b frees first
    assert pinned.session.placement == ChatSession.Placement.RIG and pinned.rig_id == rig_a.pk
    _end(second)
    assert Turn.objects.get(pk=pinned.pk).dispatched_at is None
