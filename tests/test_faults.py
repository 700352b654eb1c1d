"""Faults: a backend that hangs, a worker that died mid-turn, SQLite under two writers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inference import live, runner, services
from inference.models import ChatSession, Rig, Turn
from rigdash.launcher import ROOT


@pytest.mark.django_db(transaction=True)
def test_backend_hung_before_first_token_fails_the_turn_after_the_timeout(owner, silent_server, settings):
    settings.RIGDASH = type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "first_token_timeout_s": 1.0})
    rig = Rig.objects.create(name="hung", kind="llamacpp", base_url=silent_server, queue="rig.hung")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    turn = Turn.objects.create(session=session, user_text="hello")
    assert runner.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    assert turn.status == Turn.Status.FAILED
    assert turn.finish_reason == "timeout"
    assert "first token" in turn.error


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
    assert services.turn_reap_stale(older_than_s=60) == [stale.pk]
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
from inference import services
from inference.models import Turn
turn_id = int(sys.argv[1])
for i in range(150):
    services.turn_checkpoint(turn_id=turn_id, reply_text=f"text {i}")
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


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_new_turns_after_redis_restarts(service_env, llama_url, model_name, owner, tmp_path):
    """reliability.md: workers have been seen to stop consuming after a Redis restart. A worker with the default
    pool on a private redis-server runs a turn; the server is stopped and started again on the same port,
    empty (it keeps nothing on disk, like the machine's Redis); a turn sent afterwards runs too."""
    import shutil

    from inference.tasks import turn_run_task
    from rigdash.celery import app
    from rigdash.launcher import Stack, free_port, redis_answers
    from tests.conftest import wait_until

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port, queue = free_port(), f"rig.restart{tmp_path.name[-8:]}"
    url = f"redis://127.0.0.1:{port}/0"
    redis_cmd = [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    processes = Stack()
    try:
        redis_proc = processes.start("redis", redis_cmd, log_path=tmp_path / "redis.log")
        wait_until(lambda: redis_answers(url), timeout_s=15, what="the private redis-server")
        env = {**service_env, "REDIS_URL": url, "CELERY_BROKER_URL": url}
        processes.start(
            "worker",
            [sys.executable, "-m", "celery", "-A", "rigdash", "worker", "-Q", queue, "-c", "1", "-l", "INFO",
             "-n", f"restart{port}@localhost", "--without-gossip", "--without-mingle"],
            env=env, log_path=tmp_path / "worker.log",
        )  # fmt: skip
        rig = Rig.objects.create(name="restart", kind="llamacpp", base_url=llama_url, queue=queue)
        session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)

        def run_a_turn(text: str) -> Turn:
            turn = Turn.objects.create(session=session, user_text=text, params={"max_tokens": 8, "temperature": 0})
            with app.connection_for_write(url) as connection:
                turn_run_task.apply_async(args=[turn.pk], queue=queue, connection=connection)
            return wait_until(
                lambda: Turn.objects.filter(pk=turn.pk, status=Turn.Status.DONE).first(),
                timeout_s=90, what=f"the turn {text!r} to finish (see {tmp_path / 'worker.log'})",
            )  # fmt: skip

        assert run_a_turn("Say one word.").reply_text
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        processes.start("redis-again", redis_cmd, log_path=tmp_path / "redis-again.log")
        wait_until(lambda: redis_answers(url), timeout_s=15, what="the restarted redis-server")
        assert run_a_turn("Say another word.").reply_text  # the worker consumes again, nobody restarted it
    finally:
        processes.stop()
