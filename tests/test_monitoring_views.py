"""Dashboard routes, their permissions, and the Prometheus export."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from inference.models import Rig
from monitoring.models import RigSample
from monitoring.prometheus import render
from tests.conftest import session_cookie_for
from tests.wsclient import MonitorSocket

SERIES = {"decode_tps": 123.5, "busy_slots": 1.0, "total_slots": 4.0, "kv_used_bytes": 2304000.0,
          "gpu0_memory_used_bytes": 5e9}  # fmt: skip
DETAIL = {
    "sources": {"backend": {"ok": True, "error": ""}},
    "model": "SmolLM2",
    "turns": [{"id": 7, "user": "owner", "status": "decoding"}, {"id": 8, "user": "other", "status": "queued"}],
}


@pytest.fixture
def sampled_rig(db):
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    RigSample.objects.create(rig=rig, ts=timezone.now(), series=SERIES, detail=DETAIL)
    return rig


def _client(user=None):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def test_metrics_need_a_token_or_an_admin_session(sampled_rig, owner, admin_user, settings):
    settings.RIGDASH = type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "metrics_token": "s3cret-token"})
    assert _client().get("/metrics").status_code == 401
    assert _client(owner).get("/metrics").status_code == 401
    assert _client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    by_token = _client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert by_token.status_code == 200
    assert by_token["Content-Type"].startswith("text/plain; version=0.0.4")
    text = by_token.content.decode()
    assert 'rigdash_decode_tokens_per_second{model="SmolLM2",rig="box"} 123.5' in text
    assert 'rigdash_rig_up{model="SmolLM2",rig="box"} 1.0' in text
    assert 'rigdash_gpu_memory_used_bytes{gpu="0",model="SmolLM2",rig="box"} 5e+09' in text
    assert 'rigdash_active_turns_by_user{model="SmolLM2",rig="box",user="owner"} 1.0' in text
    assert _client(admin_user).get("/metrics").status_code == 200


def test_metrics_without_a_configured_token_refuse_any_bearer(sampled_rig):
    assert _client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_prometheus_labels_are_escaped():
    text = render([{"name": 'a"b', "model": "m\\1\n", "up": True, "series": {}, "turns_by_user": {}}])
    assert 'rigdash_rig_up{model="m\\\\1\\n",rig="a\\"b"} 1.0' in text


def test_dashboards_need_login_and_show_only_enabled_rigs(sampled_rig, owner):
    assert _client().get(f"/monitoring/rigs/{sampled_rig.pk}/").status_code == 302
    assert _client(owner).get(f"/monitoring/rigs/{sampled_rig.pk}/").status_code == 200
    assert _client(owner).get("/monitoring/").status_code == 200
    Rig.objects.filter(pk=sampled_rig.pk).update(enabled=False)
    assert _client(owner).get(f"/monitoring/rigs/{sampled_rig.pk}/").status_code == 404
    assert _client(owner).get(f"/monitoring/api/rigs/{sampled_rig.pk}/series").status_code == 404


def test_series_and_latency_feeds(sampled_rig, owner):
    body = _client(owner).get(f"/monitoring/api/rigs/{sampled_rig.pk}/series?range=5m").json()
    assert body["columns"]["series"]["decode_tps"] == [123.5]
    assert body["figures"]["decode"]["data"][0]["y"] == [123.5]
    latency = _client(owner).get(f"/monitoring/api/rigs/{sampled_rig.pk}/latency").json()
    assert latency["latency"]["gap_count"] == 0


def test_ordinary_users_see_other_users_only_as_another_user(sampled_rig, owner, admin_user):
    page = _client(owner).get(f"/monitoring/rigs/{sampled_rig.pk}/").content.decode()
    assert '"user": "another user"' in page and '"user": "other"' not in page
    admin_page = _client(admin_user).get(f"/monitoring/rigs/{sampled_rig.pk}/").content.decode()
    assert '"user": "other"' in admin_page


@pytest.mark.django_db(transaction=True)
async def test_monitoring_sockets_need_login_and_an_enabled_rig(owner):
    rig = await Rig.objects.acreate(name="r", kind="llamacpp", base_url="http://127.0.0.1:9", queue="q.r")
    assert not (await MonitorSocket(f"/ws/monitoring/rigs/{rig.pk}/", None).connect())[0]
    cookie = await sync_to_async(session_cookie_for)(owner)
    connected, code = await MonitorSocket("/ws/monitoring/rigs/999999/", cookie).connect()
    assert not connected and code == 4404
    foreign = MonitorSocket(f"/ws/monitoring/rigs/{rig.pk}/", cookie, origin="http://evil.example")
    assert not (await foreign.connect())[0]
    sock = MonitorSocket("/ws/monitoring/", cookie)
    assert (await sock.connect())[0]
    await sock.close()


def test_sample_frames_are_built_once_per_kind_of_viewer_and_keep_names_private():
    from monitoring.consumers import sample_frame

    turns = [{"turn": 1, "user": "ann"}, {"turn": 2, "user": "bob"}]
    event = {"type": "rig.sample", "rig": 3, "sample": {"ts": 1234.5, "series": {}, "detail": {"turns": turns}}}
    users = lambda frame: [t["user"] for t in json.loads(frame)["sample"]["detail"]["turns"]]  # noqa: E731
    ann = sample_frame(event, viewer="ann", is_staff=False)
    assert users(ann) == ["ann", "another user"]
    assert users(sample_frame(event, viewer="bob", is_staff=False)) == ["another user", "bob"]
    assert users(sample_frame(event, viewer="root", is_staff=True)) == ["ann", "bob"]
    assert sample_frame(event, viewer="ann", is_staff=False) is ann  # the same sample again: no new json.dumps
    later = {**event, "sample": {**event["sample"], "ts": 1235.5, "detail": {"turns": turns[1:]}}}
    assert users(sample_frame(later, viewer="ann", is_staff=False)) == ["another user"]
