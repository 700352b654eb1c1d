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
