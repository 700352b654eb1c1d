"""The fair queue hands a llama-server no more turns than the server has slots, whatever ``-np`` it was started with:
the sampler records the server's own count (``/props`` ``total_slots``) and the rig's capacity is the lesser of that
and the rig's slots (``Rig.capacity``). With more turns than slots, llama-server would queue the rest itself, out of
the fair queue's reach and out of the board's sight."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client

from inference.live import state as live
from inference.models import Rig, Turn
from inference.queue import dispatch, early
from inference.turns import submit
from monitoring import sampler
from monitoring.models import RigSample
from rigdash.launcher import Stack, free_port, wait_http
from tests.adminkit import make_session, quiet
from tests.conftest import LOG_DIR, TEST_QUEUE, wait_until
from tests.ollama_replay import OllamaReplay, smollm2


def _dispatched(rig: Rig) -> list[int]:
    rows = Turn.objects.filter(rig=rig, dispatched_at__isnull=False).order_by("pk")
    return list(rows.values_list("pk", flat=True))


def _open_slots(rig: Rig) -> int:
    return int(live.sync_client().get(early.open_slots_key(rig.pk)) or 0)


@pytest.mark.django_db(transaction=True)
def test_a_server_with_fewer_slots_than_the_rig_gets_no_more_turns_than_it_has(owner, other_user):
    """No worker listens to the rig's queue: dispatched turns stay dispatched, so only the hand-out is seen."""
    rig = quiet(Rig.objects.create(name="np", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", slots=4))
    rig.record_server_slots(1)
    assert Rig.objects.get(pk=rig.pk).capacity == 1
    turns = [submit.turn_submit(session=make_session(user, rig, "m"), text="hi") for user in (owner, other_user)]
    turns.append(submit.turn_submit(session=make_session(owner, rig, "m"), text="hi again"))
    assert _dispatched(rig) == [turns[0].pk]
    assert _open_slots(rig) == 0  # the early lane offers no slot the server lacks

    rig.record_server_slots(2)  # the server was restarted with -np 2: the next dispatch (beat's) fills the slot
    assert dispatch.rig_dispatch(rig_id=rig.pk) == [turns[1].pk]
    rig.record_server_slots(None)  # a server that reports no count: the rig's own slots
    assert dispatch.rig_dispatch(rig_id=rig.pk) == [turns[2].pk]
    assert _dispatched(rig) == [t.pk for t in turns]
    assert _open_slots(rig) == 1  # 4 slots, 3 busy


@pytest.mark.django_db(transaction=True)
def test_a_server_with_more_slots_than_the_rig_still_gets_the_rigs_count_and_the_page_says_so(admin_user):
    rig = Rig.objects.create(name="np8", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", slots=2)
    rig.record_server_slots(8)
    assert Rig.objects.get(pk=rig.pk).capacity == 2
    client = Client()
    client.force_login(admin_user)
    page = client.get("/board/rigs/").content.decode()
    assert "2 set; the server has 8: raise the rig's slots to use them" in page
    rig.record_server_slots(2)
    assert 'data-testid="rig-slots-note"' not in client.get("/board/rigs/").content.decode()


@pytest.fixture(scope="module")
def one_slot_server() -> Iterator[str]:
    """llama-server as a user starts it with one slot: ``-m`` and ``-np 1``, nothing else of RigDash's flags."""
    port = free_port()
    stack = Stack()
    command = [os.environ["LLAMA_SERVER_BIN"], "-m", os.environ["LLAMA_MODEL_PATH"], "--host", "127.0.0.1", "--port",
               str(port), "-np", "1", "-c", "2048", "-t", "1", "-tb", "1", "--no-webui"]  # fmt: skip
    proc = stack.start("llama-server-np1-slots", command, log_path=LOG_DIR / "server-slots-np1.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stack.stop()


def _tick(rig: Rig) -> dict[str, Any]:
    """One sampler tick of the rig, stored and published as the sampler does; the sample's detail."""
    asyncio.run(sampler.rig_loop(rig.pk, interval_s=0.2, ticks=1))
    rig.refresh_from_db()
    return RigSample.objects.filter(rig=rig).latest("ts").detail


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_sampler_learns_the_servers_slots_from_the_server_itself(one_slot_server, llama_url):
    """Against real llama-servers: one started with ``-np 1`` and RigDash's own test server (``-np 2``); each count
    is checked against the server's ``/props``."""
    for url in (one_slot_server, llama_url):
        told = httpx.get(f"{url}/props").json()["total_slots"]
        rig = Rig.objects.create(name=f"slots-{told}", kind=Rig.Kind.LLAMACPP, base_url=url)
        assert (rig.server_slots, rig.capacity) == (None, 4)
        detail = _tick(rig)
        assert (rig.server_slots, rig.capacity) == (told, min(4, told))
        assert detail["capacity"] == {"slots": 4, "server_slots": told, "capacity": min(4, told)}  # the rig's page


@pytest.mark.django_db(transaction=True)
def test_a_server_that_reports_no_slot_count_keeps_the_rigs_slots_and_its_page_says_what_to_set():
    """Ollama, against the replay written from its source (no Ollama binary runs here): no API reports
    OLLAMA_NUM_PARALLEL, so the rig's slots stand, and the rig's page says to set them to it."""
    replay = OllamaReplay(models=[smollm2()]).start()
    try:
        rig = Rig.objects.create(name="ollama", kind=Rig.Kind.OLLAMA, base_url=replay.url, slots=3)
        detail = _tick(rig)
    finally:
        replay.stop()
    assert detail["sources"]["backend"]["ok"] and (rig.server_slots, rig.capacity) == (None, 3)
    assert "OLLAMA_NUM_PARALLEL" in detail["capacity"]["unreported"]


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_one_slot_server_started_by_hand_keeps_the_second_turn_in_the_fair_queue(
    one_slot_server, celery_worker, owner, other_user
):
    """The rig keeps its default 4 slots; the sampler's reading alone holds the second user's turn in RigDash's
    queue (where the board shows it waiting) until the first ends, not inside llama-server."""
    rig = Rig.objects.create(name="np1", kind=Rig.Kind.LLAMACPP, base_url=one_slot_server, queue=TEST_QUEUE)
    _tick(rig)
    model = httpx.get(f"{one_slot_server}/v1/models").json()["data"][0]["id"]
    long = {"temperature": 0, "max_tokens": 80}
    story = "Write a story about a cat."
    first = submit.turn_submit(session=make_session(owner, rig, model), text=story, params=long)
    wait_until(lambda: Turn.objects.get(pk=first.pk).status == Turn.Status.DECODING, timeout_s=60, what="decoding")
    second = submit.turn_submit(session=make_session(other_user, rig, model), text="Say hi.", params={"max_tokens": 4})
    assert Turn.objects.get(pk=second.pk).dispatched_at is None

    def finished() -> bool:
        return set(Turn.objects.filter(pk__in=[first.pk, second.pk]).values_list("status", flat=True)) == {"done"}

    wait_until(finished, timeout_s=120, what="both turns done")
    one, two = Turn.objects.get(pk=first.pk), Turn.objects.get(pk=second.pk)
    assert one.finished_at is not None and two.dispatched_at is not None and one.finished_at <= two.dispatched_at
