"""Faults: a backend that hangs, a worker that died mid-turn, SQLite under two writers."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from typing import Any

import pytest

from inference.live import state as live
from inference.models import ChatSession, Rig, Turn
from inference.turns import lifecycle
from inference.worker import start as starts
from rigdash.launcher import ROOT, worker_command


@pytest.mark.django_db(transaction=True)
def test_backend_hung_before_first_token_fails_the_turn_after_the_timeout(owner, silent_server, settings):
    settings.RIGDASH = type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "first_token_timeout_s": 1.0})
    rig = Rig.objects.create(name="hung", kind="llamacpp", base_url=silent_server, queue="rig.hung")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    turn = Turn.objects.create(session=session, user_text="hello")
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert turn.finish_reason == "timeout"
    assert "first token" in turn.error


@pytest.fixture
def stalling_server() -> Any:
    """A llama-server look-alike that streams two tokens, then sends nothing more and keeps the connection open: a
    backend that hangs mid-reply."""
    import json
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn = server.accept()[0]
            held.append(conn)
            conn.recv(65536)  # the request
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            body = b"".join(
                b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"
                for text in ("Hello", " world")
            )
            conn.sendall(head + f"{len(body):x}\r\n".encode() + body + b"\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    for conn in held:
        conn.close()
    server.close()
    thread.join(timeout=5)


@pytest.mark.django_db(transaction=True)
def test_backend_hung_mid_reply_keeps_its_text_checkpointed_and_fails_the_turn_after_the_stall_timeout(
    owner, stalling_server, settings
):
    """While the backend sends nothing the turn's task still checkpoints the reply (what a worker that dies then
    leaves behind), and the stall timeout ends the turn with its partial text."""
    import threading
    import time

    settings.RIGDASH = type(settings.RIGDASH)(
        **{**vars(settings.RIGDASH), "stall_timeout_s": 1.5, "checkpoint_interval_s": 0.5}
    )
    rig = Rig.objects.create(name="stalls", kind="llamacpp", base_url=stalling_server, queue="rig.stalls")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    turn = Turn.objects.create(session=session, user_text="hello")
    result: list[str] = []
    runner_thread = threading.Thread(target=lambda: result.append(starts.turn_run(turn.pk)))
    started = time.monotonic()
    runner_thread.start()
    checkpointed = None
    while runner_thread.is_alive() and time.monotonic() - started < 10:
        row = Turn.objects.get(pk=turn.pk)
        if row.status in Turn.RUNNING and row.reply_text == "Hello world":
            checkpointed = time.monotonic() - started
            break
        time.sleep(0.05)
    runner_thread.join(timeout=20)
    assert result == ["ran"]
    assert checkpointed is not None, "the reply was not checkpointed while the backend stalled"
    turn.refresh_from_db()
    assert (turn.status, turn.finish_reason, turn.reply_text) == (Turn.Status.FAILED, "timeout", "Hello world")
    assert "next token" in turn.error
    assert 1.5 <= time.monotonic() - started < 10


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_database_refusing_the_checkpoints_and_the_decoding_mark_mid_reply_loses_nothing(
    chat_session, settings, monkeypatch
):
    """The database refuses every write while the reply streams (the real llama-server); only the writes are made to
    fail, as a database outage cannot be started and ended around one turn here. The checkpoints and the decoding
    mark are views of a running turn: the reply streams on, and the end stores it whole."""
    from django.db import OperationalError

    settings.RIGDASH = type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "checkpoint_interval_s": 0.1})
    refused: list[str] = []

    def refuse(name: str) -> Any:
        def write(**kwargs: Any) -> None:
            refused.append(name)
            raise OperationalError("server closed the connection unexpectedly")

        return write

    monkeypatch.setattr(lifecycle, "turn_checkpoint", refuse("checkpoint"))
    monkeypatch.setattr(lifecycle, "turn_mark_decoding", refuse("decoding"))
    turn = Turn.objects.create(
        session=chat_session, user_text="Write a long story about a lighthouse.", params={"max_tokens": 96, "seed": 1}
    )
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert "decoding" in refused and "checkpoint" in refused, refused  # both writes were tried, and failed
    assert turn.status == Turn.Status.DONE and turn.finish_reason in ("stop", "length")
    pages_got = live.snapshot(turn.pk)  # every batch the pages were sent
    assert (turn.reply_text, turn.stats["output_events"]) == (pages_got.text, pages_got.seq)
    assert pages_got.seq > 0 and pages_got.text


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_turns_end_the_database_refuses_twice_is_stored_whole_on_the_third_try(chat_session, monkeypatch):
    """The end's write fails twice (made to fail: a database outage cannot be started and ended around one turn
    here), then the database is back: the turn ends as it would have, not as interrupted by the reaper later."""
    from django.db import OperationalError

    store = lifecycle.turn_finish
    tries: list[float] = []

    def flaky(**kwargs: Any) -> bool:
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise OperationalError("the database system is starting up")
        return store(**kwargs)

    monkeypatch.setattr(lifecycle, "turn_finish", flaky)
    monkeypatch.setattr(starts, "FINISH_RETRY_S", (0.2, 0.2, 0.2))
    turn = Turn.objects.create(session=chat_session, user_text="Say hello.", params={"max_tokens": 24, "seed": 1})
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert len(tries) == 3 and tries[2] - tries[0] >= 0.4  # two waits before the third try
    assert turn.status == Turn.Status.DONE and turn.finish_reason in ("stop", "length")
    assert turn.reply_text == live.snapshot(turn.pk).text != ""
    assert turn.stats["output_events"] == live.snapshot(turn.pk).seq


@pytest.mark.django_db
def test_turn_whose_worker_died_ends_interrupted_with_its_text(chat_session):
    from datetime import timedelta

    from django.utils import timezone

    stale = Turn.objects.create(
        session=chat_session, user_text="q", status=Turn.Status.DECODING,
        heartbeat_at=timezone.now() - timedelta(minutes=5), reply_text="Hel",
    )  # fmt: skip
    fresh = Turn.objects.create(
        session=chat_session, user_text="q2", status=Turn.Status.DECODING, heartbeat_at=timezone.now()
    )
    client = live.sync_client()
    client.rpush(live.live_key(stale.pk), live.encode_batch(1, 2, "Hello"), live.encode_batch(3, 3, " world"))
    assert lifecycle.turn_reap_stale(older_than_s=60) == [stale.pk]
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == Turn.Status.INTERRUPTED
    assert stale.reply_text == "Hello world"  # the live text, newer than the last checkpoint
    assert stale.stats["output_events"] == 3
    assert fresh.status == Turn.Status.DECODING


WRITER = """
import django, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "rigdash.settings"
django.setup()
from inference.models import Turn
from inference.turns import lifecycle
turn_id = int(sys.argv[1])
for i in range(150):
    lifecycle.turn_checkpoint(turn_id=turn_id, reply_text=f"text {i}")
    Turn.objects.filter(pk=turn_id).count()
print("ok")
"""


def test_sqlite_takes_a_web_server_and_a_worker_writing_at_once(tmp_path):
    """The embedded run uses SQLite: two processes writing together must not hit 'database is locked'."""
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "RIGDASH_VAR_DIR": str(tmp_path), "PATH": ""}
    setup = (
        "import django,os;os.environ['DJANGO_SETTINGS_MODULE']='rigdash.settings';django.setup();"
        "from django.core.management import call_command;call_command('migrate',verbosity=0);"
        "from django.contrib.auth.models import User;from inference.models import *;"
        "u=User.objects.create(username='u');r=Rig.objects.create(name='r',kind='llamacpp',base_url='http://x',queue='q');"
        "s=ChatSession.objects.create(owner=u,rig=r,model_name='m');"
        "print(Turn.objects.create(session=s,user_text='a',status='decoding').pk,"
        "Turn.objects.create(session=s,user_text='b',status='decoding').pk)"
    )
    ids = subprocess.run(
        [sys.executable, "-c", setup], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, turn_id],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for turn_id in ids
    ]
    for proc in writers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err[-2000:]


REDIS_BOUND_S = 90.0  # a turn's end after a Redis restart, on a loaded machine


class PrivateRedisWorker:
    """A redis-server of the test's own and a worker (the default pool) using it as broker and live store, so that
    the test can stop and restart Redis under a running worker. It keeps nothing on disk, like the machine's."""

    def __init__(self, service_env: dict[str, str], tmp_path: Any) -> None:
        import shutil

        from rigdash.launcher import Stack, free_port

        server = shutil.which("redis-server")
        if server is None:
            pytest.skip("redis-server is not installed")
        self.port, self.tmp_path = free_port(), tmp_path
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.queue = f"rig.restart{self.port}"
        self.redis_cmd = [server, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        self.processes = Stack()
        self.env = {**service_env, "REDIS_URL": self.url, "CELERY_BROKER_URL": self.url}

    def start(self) -> None:
        self.redis_proc = self._redis("redis")
        self.processes.start(
            "worker",
            worker_command(
                queues=[self.queue], concurrency=1, name=f"restart{self.port}@localhost", beat_schedule=None
            ),
            env=self.env, log_path=self.tmp_path / "worker.log",
        )  # fmt: skip

    def _redis(self, name: str) -> Any:
        from rigdash.launcher import redis_answers
        from tests.conftest import wait_until

        proc = self.processes.start(name, self.redis_cmd, log_path=self.tmp_path / f"{name}.log")
        wait_until(lambda: redis_answers(self.url), timeout_s=15, what=f"{name} to answer")
        return proc

    def restart_redis(self) -> None:
        self.redis_proc.terminate()
        self.redis_proc.wait(timeout=10)
        self.redis_proc = self._redis("redis-again")

    def send(self, turn: Turn) -> None:
        from inference.tasks import turn_run_task
        from rigdash.celery import app

        with app.connection_for_write(self.url) as connection:
            turn_run_task.apply_async(args=[turn.pk], queue=self.queue, connection=connection)

    def wait_done(self, turn: Turn, timeout_s: float = 90) -> Turn:
        from tests.conftest import wait_until

        return wait_until(
            lambda: Turn.objects.filter(pk=turn.pk).exclude(status__in=Turn.ACTIVE).first(),
            timeout_s=timeout_s, what=f"turn {turn.pk} to end (see {self.tmp_path / 'worker.log'})",
        )  # fmt: skip


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_new_turns_after_redis_restarts(service_env, llama_url, model_name, owner, tmp_path):
    """reliability.md: workers have been seen to stop consuming after a Redis restart. A turn runs; Redis is
    stopped and started again, empty; a turn sent afterwards runs too, and nobody restarted the worker."""
    rw = PrivateRedisWorker(service_env, tmp_path)
    try:
        rw.start()
        rig = Rig.objects.create(name="restart", kind="llamacpp", base_url=llama_url, queue=rw.queue)
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
        params = {"max_tokens": 8, "temperature": 0}
        for text in ("Say one word.", "Say another word."):
            turn = Turn.objects.create(session=session, user_text=text, params=params)
            started = time.monotonic()
            rw.send(turn)
            assert rw.wait_done(turn, timeout_s=REDIS_BOUND_S).status == Turn.Status.DONE
            if text == "Say one word.":
                rw.restart_redis()
        print(f"\n[fault] Redis restarted idle: the next turn done in {time.monotonic() - started:.1f} s")
    finally:
        rw.processes.stop()


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_reply_streaming_while_redis_restarts_ends_whole(service_env, llama_url, model_name, owner, tmp_path):
    """Redis restarts (empty) in the middle of a reply: the worker holds the tokens it cannot publish, keeps
    decoding, rebuilds the live list whole once Redis is back (a reconnecting page gets seq 1..n), and the turn
    ends done with the whole reply stored, within REDIS_BOUND_S; the next turn runs on the same worker."""
    import redis as redis_lib

    from inference.live.state import decode_snapshot, live_key
    from tests.conftest import wait_until

    rw = PrivateRedisWorker(service_env, tmp_path)
    try:
        rw.start()
        rig = Rig.objects.create(name="restart", kind="llamacpp", base_url=llama_url, queue=rw.queue)
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
        params = {"max_tokens": 256, "temperature": 0.7, "seed": 5}
        turn = Turn.objects.create(session=session, user_text="Write a long story about a lighthouse.", params=params)
        client = redis_lib.Redis.from_url(rw.url)
        rw.send(turn)
        wait_until(lambda: client.llen(live_key(turn.pk)) >= 3, timeout_s=60, what="the first batches")
        before = decode_snapshot(client.lrange(live_key(turn.pk), 0, -1))
        rw.restart_redis()
        client = redis_lib.Redis.from_url(rw.url)
        seen = []

        def rebuilt_or_ended() -> bool:
            batches = client.lrange(live_key(turn.pk), 0, -1)
            if batches:
                seen.append(decode_snapshot(batches))  # raises if the list does not run 1..n in order
            return bool(batches) or not Turn.objects.filter(pk=turn.pk, status__in=Turn.ACTIVE).exists()

        restarted = time.monotonic()
        wait_until(rebuilt_or_ended, timeout_s=60, interval_s=0.01, what="the live list back, or the turn's end")
        done = rw.wait_done(turn, timeout_s=REDIS_BOUND_S)
        took = time.monotonic() - restarted
        after = Turn.objects.create(session=session, user_text="Say hello.", params={"max_tokens": 8, "temperature": 0})
        rw.send(after)  # nothing restarted but Redis
        assert rw.wait_done(after, timeout_s=REDIS_BOUND_S).status == Turn.Status.DONE
    finally:
        rw.processes.stop()
    print(f"\n[fault] Redis restarted mid-reply: turn {done.status} {took:.1f} s later; the next turn done")
    assert done.status == Turn.Status.DONE, (done.status, done.error)
    assert done.reply_text.startswith(before.text) and len(done.reply_text) > len(before.text)
    assert all(done.reply_text.startswith(snapshot.text) for snapshot in seen)
    assert seen == [] or seen[0].seq > before.seq  # rebuilt from seq 1 through the tokens held meanwhile


@pytest.mark.django_db(transaction=True)
async def test_open_pages_keep_receiving_after_redis_restarts(owner, chat_session, settings, tmp_path):
    """The other half of a Redis restart: a chat page's socket stays open, and the channel layer's subscription
    behind it must come back, or the page would hear nothing more until reloaded. The layer here is the same
    channels_redis pub/sub layer Daphne runs, pointed at a private redis-server that is restarted."""
    import time

    from asgiref.sync import sync_to_async
    from channels.layers import channel_layers, get_channel_layer

    from inference import events
    from tests.conftest import session_cookie_for
    from tests.wsclient import ChatSocket

    rw = PrivateRedisWorker({}, tmp_path)
    rw.redis_proc = await asyncio.to_thread(rw._redis, "redis")
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "rigdash.channel_layer.FanoutPubSubChannelLayer",
            "CONFIG": {"hosts": [rw.url], "prefix": f"restart{rw.port}"},
        }
    }
    channel_layers.backends.clear()
    group = events.session_group(chat_session.pk)
    sock = ChatSocket(chat_session.pk, await sync_to_async(session_cookie_for)(owner))
    try:
        connected, _ = await sock.connect()
        assert connected
        await sock.recv_until(lambda f: f["type"] == "session.snapshot")
        layer = get_channel_layer()
        batch = events.token_batch_message(turn_id=1, seq_from=1, seq_to=1, text="a", stats={})
        await layer.group_send(group, batch)
        await sock.recv_until(lambda f: f["type"] == "token" and f["seq_to"] == 1, timeout=10)

        await asyncio.to_thread(rw.restart_redis)
        later = events.token_batch_message(turn_id=1, seq_from=2, seq_to=2, text="b", stats={})
        deadline = time.monotonic() + 30
        heard = False
        while not heard:  # the subscriber reconnects on its own; publish until the page hears it (bounded)
            assert time.monotonic() < deadline, "the page heard nothing for 30 s after Redis came back"
            with contextlib.suppress(Exception):
                await layer.group_send(group, later)
            # receive_nothing waits without ending the app on a timeout (receive_from would)
            while not await sock.comm.receive_nothing(timeout=1):
                frame = await sock.recv(timeout=5)
                heard = heard or (frame["type"] == "token" and frame["seq_to"] == 2)
    finally:
        await sock.close()
        channel_layers.backends.clear()
        await asyncio.to_thread(rw.processes.stop)
