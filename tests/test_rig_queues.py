"""A rig whose queue no worker consumes is reported: in /healthz and on the rig's monitoring page."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from django.test import Client

from inference.models import Rig
from monitoring import queues
from rigdash.launcher import Stack, worker_command
from tests.conftest import LOG_DIR, free_port

QUEUE = f"rig.consumed{os.getpid()}"


@pytest.fixture(scope="module")
def queue_worker(stack: Stack, service_env: dict[str, str]) -> Iterator[str]:
    """A real Celery worker on QUEUE only."""
    name = f"queues{os.getpid()}@localhost"
    stack.start("queue-worker", worker_command(queues=[QUEUE], concurrency=1, name=name, beat_schedule=None),
                env=service_env, log_path=LOG_DIR / "queue-worker.log")  # fmt: skip
    from rigdash.celery import app

    deadline = time.monotonic() + 60
    while not any(name in reply for reply in app.control.ping(timeout=0.5)):
        assert time.monotonic() < deadline, f"worker did not answer; see {LOG_DIR / 'queue-worker.log'}"
    yield name


@pytest.fixture
def rigs(db):
    queues.forget()
    served = Rig.objects.create(name="served", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue=QUEUE)
    orphan = Rig.objects.create(name="orphan", kind="ollama", base_url="http://ollama:11434")
    Rig.objects.create(name="off", kind="ollama", base_url="http://off:11434", enabled=False)
    yield served, orphan
    queues.forget()


@pytest.mark.django_db
def test_healthz_names_a_rig_whose_queue_has_no_worker(queue_worker, rigs, admin_user):
    client = Client()
    client.force_login(admin_user)  # the details are for admins (anonymous callers get only up or down)
    body = client.get("/healthz").json()
    assert body["checks"]["queues"]["served"] == {
        "ok": True, "queue": QUEUE, "workers": [queue_worker], "detail": "1 worker(s)"
    }  # fmt: skip
    assert body["checks"]["queues"]["orphan"]["ok"] is False
    assert body["checks"]["queues"]["orphan"]["detail"] == "no worker consumes rig.orphan"
    assert "queue:orphan" in body["down"] and "queue:served" not in body["down"]
    assert "off" not in body["checks"]["queues"], "a disabled rig needs no worker"


@pytest.mark.django_db
def test_the_rig_page_says_so_and_a_consumed_rig_s_does_not(queue_worker, rigs, owner, admin_user):
    served, orphan = rigs
    client = Client()
    client.force_login(owner)
    page = client.get(f"/monitoring/rigs/{orphan.pk}/").content.decode()
    assert 'data-testid="no-consumer"' in page and "Tell an admin" in page
    assert "rig.orphan" not in page  # the queue's name is a staff detail (docs/reliability.md, the monitoring audit)
    staff = Client()
    staff.force_login(admin_user)
    assert "-Q rig.orphan" in staff.get(f"/monitoring/rigs/{orphan.pk}/").content.decode()
    page = client.get(f"/monitoring/rigs/{served.pk}/").content.decode()
    assert 'data-testid="no-consumer"' not in page


def test_the_answer_is_cached_for_a_few_seconds(monkeypatch):
    calls = []

    def ask(*, timeout_s, app):
        calls.append(timeout_s)
        return queues.Consumers(by_worker={"w@h": frozenset({"rig.a"})})

    monkeypatch.setattr(queues, "_ask", ask)
    queues.forget()
    try:
        assert queues.consumers().workers_of("rig.a") == ["w@h"]
        assert queues.consumers().workers_of("rig.b") == []
        assert len(calls) == 1
        assert queues.consumers(max_age_s=0).queues == {"rig.a"}
        assert len(calls) == 2
    finally:
        queues.forget()


def test_a_failed_broadcast_is_reported_with_its_error():
    found = queues.Consumers(by_worker={}, error="ConnectionRefusedError(111)")
    report = queues.rig_consumers([Rig(name="r", queue="rig.r")], found)
    assert report["r"] == {"ok": False, "queue": "rig.r", "workers": [],
                           "detail": "cannot ask the workers: ConnectionRefusedError(111)"}  # fmt: skip


@pytest.mark.django_db
def test_a_user_s_chat_on_a_rig_without_a_worker_says_so(queue_worker, rigs, owner, admin_user):
    from inference.models import ChatSession

    served, orphan = rigs
    waiting = ChatSession.objects.create(owner=owner, rig=orphan, model_name="m")
    fine = ChatSession.objects.create(owner=owner, rig=served, model_name="m")
    queues.consumers(max_age_s=0)  # the chat page never waits for the broadcast: fill the cache first
    client = Client()
    client.force_login(owner)
    page = client.get(f"/sessions/{waiting.pk}/").content.decode()
    assert 'data-testid="no-consumer"' in page and "Tell an admin" in page and "rig.orphan" not in page
    assert 'data-testid="no-consumer"' not in client.get(f"/sessions/{fine.pk}/").content.decode()


def test_pages_every_user_opens_never_wait_for_the_broadcast(monkeypatch):
    import threading

    release = threading.Event()

    def ask(*, timeout_s, app):
        release.wait(10)
        return queues.Consumers(by_worker={"w@h": frozenset({"rig.a"})})

    monkeypatch.setattr(queues, "_ask", ask)
    queues.forget()
    try:
        assert queues.consumers_nowait() is None, "nothing known yet: no banner, and no wait"
        assert queues.consumers_nowait() is None, "one refresh at a time"
        release.set()
        deadline = time.monotonic() + 10
        while (found := queues.consumers_nowait()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert found.queues == {"rig.a"}
    finally:
        release.set()
        queues.forget()


@pytest.mark.django_db(transaction=True)
async def test_a_waiting_chat_is_told_live_that_no_worker_serves_its_rig_and_when_one_does(queue_worker, rigs, owner):
    """The page's banner was computed at load only. Now the workers' answer (the sampler asks every few seconds) is
    recorded, the periodic dispatch tells each waiting turn of a rig nobody serves why it waits (turn.state), and
    tells it once more when a worker is there; the page's snapshot says the same. chat.js shows its banner on
    exactly this reason."""
    from asgiref.sync import sync_to_async
    from django.utils import timezone

    from inference.live import consumers
    from inference.models import ChatSession, Turn
    from inference.queue import dispatch
    from rigdash.launcher import ROOT
    from tests.conftest import session_cookie_for
    from tests.wsclient import ChatSocket

    served, orphan = rigs
    session = await ChatSession.objects.acreate(owner=owner, rig=orphan, model_name="m")
    # Handed to rig.orphan's queue (position 0, "starting"), where no worker will ever claim it.
    turn = await Turn.objects.acreate(session=session, user_text="hello", dispatched_at=timezone.now())
    await sync_to_async(queues.consumers)(max_age_s=0)  # the sampler's probe: real workers answer
    assert await sync_to_async(consumers.unconsumed)(orphan.queue)
    assert not await sync_to_async(consumers.unconsumed)(served.queue)
    assert consumers.NO_WORKER in (ROOT / "static" / "rigdash" / "chat.js").read_text()

    def is_state(frame):
        return frame["type"] == "turn.state" and frame["turn"] == turn.pk

    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    try:
        snapshot = await sock.recv_until(lambda f: f["type"] == "session.snapshot")
        [loaded] = snapshot["turns"]
        assert (loaded["queue_position"], loaded["waiting_reason"]) == (0, consumers.NO_WORKER)
        await sync_to_async(dispatch.dispatch_all)()
        told = await sock.recv_until(is_state, timeout=10)
        assert (told["status"], told["queue_position"], told["waiting_reason"]) == ("queued", 0, consumers.NO_WORKER)
        await sync_to_async(dispatch.dispatch_all)()  # told again while it lasts (a page opened meanwhile)
        assert (await sock.recv_until(is_state, timeout=10))["waiting_reason"] == consumers.NO_WORKER
        # A worker for the rig's queue starts: the next answer has it, and the turn is told the reason is gone.
        await sync_to_async(consumers.record)([served.queue, orphan.queue])
        await sync_to_async(dispatch.dispatch_all)()
        cleared = await sock.recv_until(is_state, timeout=10)
        assert cleared["queue_position"] == 0 and "waiting_reason" not in cleared
        # Told once: the pass remembers what it said last ("" now) and has nothing more to say.
        assert await sync_to_async(consumers.swap_told)(orphan.pk, "") == ""
    finally:
        await sock.close()
        await sync_to_async(consumers.swap_told)(orphan.pk, "")
