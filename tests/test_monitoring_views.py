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
from monitoring.selectors import PLAIN_SOURCE_REASONS
from tests.conftest import page_json, session_cookie_for
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
    def users_shown(client: Client) -> set[str]:
        page = client.get(f"/monitoring/rigs/{sampled_rig.pk}/").content.decode()
        return {turn["user"] for turn in page_json(page)["latest"]["detail"]["turns"]}

    shown = users_shown(_client(owner))
    assert "another user" in shown and "other" not in shown
    assert "other" in users_shown(_client(admin_user))


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
    # Users with no turn in the sample all see the same frame: it is built once for them, not once per viewer.
    carol = sample_frame(event, viewer="carol", is_staff=False)
    assert users(carol) == ["another user", "another user"]
    assert sample_frame(event, viewer="dan", is_staff=False) is carol
    later = {**event, "sample": {**event["sample"], "ts": 1235.5, "detail": {"turns": turns[1:]}}}
    assert users(sample_frame(later, viewer="ann", is_staff=False)) == ["another user"]
    assert sample_frame(later, viewer="ann", is_staff=False) is sample_frame(later, viewer="carol", is_staff=False)
    nan = {**event, "sample": {"ts": 1236.5, "series": {"decode_tps": float("nan")}, "detail": {}}}
    assert json.loads(sample_frame(nan, viewer="ann", is_staff=False))["sample"]["series"] == {"decode_tps": None}


def test_the_overview_frame_holds_what_its_rows_show_and_no_user_names():
    from monitoring.consumers import overview_frame, sample_frame

    backend = {"ok": False, "error": "connection refused"}
    agent = {"expected": True, "up": False, "label": "agent silent"}
    detail = {"turns": [{"turn": 1, "user": "ann"}], "slots": [{"id": 0, "n_ctx": 4096}] * 16,
              "sources": {"backend": backend, "gpu": {"ok": True, "error": ""}}, "agent": agent}  # fmt: skip
    event = {"type": "rig.sample", "rig": 4, "sample": {"ts": 99.5, "series": {"decode_tps": 12.5}, "detail": detail}}
    frame = overview_frame(event, is_staff=True)
    assert json.loads(frame) == {
        "type": "rig.sample",
        "rig": 4,
        "sample": {
            "ts": 99.5,
            "series": {"decode_tps": 12.5},
            "detail": {"sources": {"backend": backend}, "agent": agent},
        },
    }
    assert "ann" not in frame and overview_frame(event, is_staff=True) is frame  # built once a sample
    plain = json.loads(overview_frame(event, is_staff=False))["sample"]["detail"]  # as sample_frame redacts it
    assert plain["sources"]["backend"] == {"ok": False, "error": PLAIN_SOURCE_REASONS["backend"]}
    assert len(frame) < len(sample_frame(event, viewer="root", is_staff=True)) / 2.5
    without_agent = {**event, "sample": {**event["sample"], "ts": 100.5, "detail": {"sources": {}}}}
    assert json.loads(overview_frame(without_agent, is_staff=True))["sample"]["detail"] == {"sources": {"backend": {}}}


# What a broken backend, host or broker puts in a sample: the rig's URL, host names, file paths, exception text.
SECRETS = ("10.20.30.40", "gpu-box-7.internal", "/srv/models/secret", "ConnectError", "AccessDenied", "redis://")
LEAKY_DETAIL = {
    "rig": "box",
    "sources": {
        "backend": {"ok": False, "error": "llama-server unreachable: ConnectError('http://10.20.30.40:8080/slots')"},
        "kv": {"ok": False, "error": "cannot read the GGUF metadata of /srv/models/secret/SmolLM2.gguf: OSError()"},
        "process": {"ok": False, "error": "cannot read process 4242: AccessDenied(pid=4242)"},
        "queue": {"ok": False, "error": "ConnectionError('redis://10.20.30.40:6379/0')"},
        "gpu": {"ok": True, "error": ""},
    },
    "model": "/srv/models/secret/SmolLM2-135M-Instruct-Q4_1.gguf",
    "agent": {
        "expected": True,
        "up": True,
        "last_seen": 1.0,
        "host": "gpu-box-7.internal",
        "instance": "i-1",
        "error": "",
        "label": "agent up on gpu-box-7.internal",
    },
    "process": {"pid": 4242, "name": "llama-server", "rss_bytes": 1.0, "vram_error": "AccessDenied(pid=4242)"},
    "placement": {
        "vram_fraction": None,
        "spill": None,
        "why": "cannot read process 4242: AccessDenied(pid=4242)",
        "label": "GPU present: layer split not reported by llama-server"
        " (cannot read process 4242: AccessDenied(pid=4242))",
    },
    "turns": [],
}


@pytest.fixture
def leaky_rig(db):
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://10.20.30.40:8080", queue="rig.box")
    RigSample.objects.create(rig=rig, ts=timezone.now(), series=SERIES, detail=LEAKY_DETAIL)
    return rig


def test_ordinary_users_see_no_backend_detail_on_the_monitoring_pages_and_staff_do(
    leaky_rig, owner, admin_user, monkeypatch
):
    """reliability.md: internal URLs, host names, file paths and exception text are for staff. The broker that
    cannot be asked which workers consume (mocked: stopping the machine's Redis would stop every other test)."""
    from monitoring import views
    from monitoring.queues import Consumers

    monkeypatch.setattr(views, "consumers", lambda **kw: Consumers({}, error="ConnectionError('redis://10.20.30.40')"))
    for path in (f"/monitoring/rigs/{leaky_rig.pk}/", "/monitoring/"):
        page = _client(owner).get(path).content.decode()
        assert not [secret for secret in SECRETS if secret in page], path
    page = _client(owner).get(f"/monitoring/rigs/{leaky_rig.pk}/").content.decode()
    assert "SmolLM2-135M-Instruct-Q4_1.gguf" in page  # the model's name, without its directories
    assert "the backend could not be reached" in page and "No worker serves box" in page
    assert "rig.box" not in page  # the internal queue name too
    staff = _client(admin_user).get(f"/monitoring/rigs/{leaky_rig.pk}/").content.decode()
    assert all(secret in staff for secret in SECRETS)


@pytest.mark.django_db(transaction=True)
async def test_the_monitoring_sockets_send_ordinary_users_no_backend_detail(owner, admin_user):
    from channels.layers import get_channel_layer

    from monitoring import events

    rig = await Rig.objects.acreate(name="box", kind="llamacpp", base_url="http://10.20.30.40:8080", queue="q.box")
    frames = {}
    for user in (owner, admin_user):
        cookie = await sync_to_async(session_cookie_for)(user)
        sockets = [MonitorSocket(f"/ws/monitoring/rigs/{rig.pk}/", cookie), MonitorSocket("/ws/monitoring/", cookie)]
        for sock in sockets:
            assert (await sock.connect())[0]
        sample = {"ts": timezone.now().timestamp(), "series": SERIES, "detail": LEAKY_DETAIL}
        event = {"type": "rig.sample", "rig": rig.pk, "sample": sample}
        for group in (events.rig_group(rig.pk), events.OVERVIEW_GROUP):
            await get_channel_layer().group_send(group, event)
        frames[user.username] = [json.dumps(await sock.recv(timeout=10)) for sock in sockets]
        for sock in sockets:
            await sock.close()
    for frame in frames["owner"]:  # the rig's dashboard, then the overview
        assert not [secret for secret in SECRETS if secret in frame], frame
        detail = json.loads(frame)["sample"]["detail"]
        assert detail["agent"]["label"] == "agent up" and "process" not in detail
    dashboard = json.loads(frames["owner"][0])["sample"]["detail"]
    assert dashboard["placement"]["label"] == "GPU present: layer split not reported by llama-server"
    admin_dashboard, admin_overview = frames["admin"]
    assert all(secret in admin_dashboard for secret in SECRETS)
    overview = json.loads(admin_overview)["sample"]["detail"]  # staff: the overview's part of the detail, whole
    assert overview == {"sources": {"backend": LEAKY_DETAIL["sources"]["backend"]}, "agent": LEAKY_DETAIL["agent"]}
