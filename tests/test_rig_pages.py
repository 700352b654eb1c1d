"""Rigs managed in RigDash's own pages (staff only): create, edit, delete (refused while chats use the rig), an agent
key issued once, and the rig's monitoring profile; each change audited, everyone else gets 404."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import AuditLog, ChatSession, Rig
from monitoring.models import RigProfile
from tests.adminkit import make_user

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.fixture
def staff():
    """A superuser: adding a rig and changing its URL or kind are theirs (tests below: staff edit the rest)."""
    return make_user("boss", is_staff=True, is_superuser=True)


@pytest.fixture
def plain_staff():
    return make_user("staffer", is_staff=True)


def test_staff_add_a_rig_on_a_single_label_host_and_edit_it(staff):
    client = _client(staff)
    form = {"name": "gpu-box", "kind": "ollama", "base_url": "http://ollama:11434", "slots": 2, "enabled": "on"}
    assert client.post("/board/rigs/new", form).status_code == 302
    rig = Rig.objects.get(name="gpu-box")
    assert (rig.queue, rig.base_url, rig.slots) == ("rig.gpu-box", "http://ollama:11434", 2)
    assert client.post(f"/board/rigs/{rig.pk}/", {**form, "slots": 4}).status_code == 302
    rig.refresh_from_db()
    assert rig.slots == 4
    actions = list(AuditLog.objects.order_by("id").values_list("action", "detail"))
    assert actions[0][0] == "rig.create" and actions[1] == ("rig.update", {"slots": 4})
    page = client.get("/board/rigs/").content.decode()
    assert "gpu-box" in page and "no agent" in page


def test_bad_rig_input_is_refused_with_a_clear_message_and_nothing_stored(staff):
    client = _client(staff)
    bad = {"name": "x y", "kind": "llamacpp", "base_url": "ftp://box/", "slots": 0}
    response = client.post("/board/rigs/new", bad)
    assert response.status_code == 400 and not Rig.objects.filter(base_url="ftp://box/").exists()


def test_a_rig_with_chats_is_not_deleted_but_can_be_disabled(staff, owner):
    rig = Rig.objects.create(name="old", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.old")
    ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    response = _client(staff).post(f"/board/rigs/{rig.pk}/delete")
    assert response.status_code == 400 and "disable it instead" in response.content.decode()
    assert Rig.objects.filter(pk=rig.pk).exists()
    empty = Rig.objects.create(name="empty", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.empty")
    assert _client(staff).post(f"/board/rigs/{empty.pk}/delete").status_code == 302
    assert not Rig.objects.filter(pk=empty.pk).exists()
    assert AuditLog.objects.filter(action="rig.delete", target="rig:empty").exists()


def test_an_agent_key_is_shown_once_stored_and_never_logged(staff):
    rig = Rig.objects.create(name="far", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.far")
    page = _client(staff).post(f"/board/rigs/{rig.pk}/agent-key").content.decode()
    rig.refresh_from_db()
    assert len(rig.agent_key) >= 40 and rig.agent_key in page
    entry = AuditLog.objects.get(action="rig.agent_key")
    assert rig.agent_key not in str(entry.detail)
    assert rig.agent_key not in _client(staff).get("/board/rigs/").content.decode()  # once


def test_the_profile_page_validates_and_sets_an_admins_bandwidth(staff):
    rig = Rig.objects.create(name="p", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.p")
    client = _client(staff)
    impossible = {
        "kv_cache_type": "f16",
        "bandwidth_gbs": -5,
        "model_layers": 30,
        "model_kv_heads": "",
        "model_head_dim": 64,
    }
    assert client.post(f"/monitoring/rigs/{rig.pk}/profile/", impossible).status_code == 400
    good = {
        "kv_cache_type": "q8_0",
        "bandwidth_gbs": 936,
        "model_layers": 30,
        "model_kv_heads": 3,
        "model_head_dim": 64,
    }
    assert client.post(f"/monitoring/rigs/{rig.pk}/profile/", good).status_code == 302
    profile = RigProfile.objects.get(rig=rig)
    assert (profile.kv_cache_type, profile.bandwidth_gbs, profile.bandwidth_source) == ("q8_0", 936, "setting")
    assert profile.geometry() is not None and AuditLog.objects.filter(action="rig.profile").exists()


def test_everyone_else_gets_404_on_every_rig_page(owner):
    rig = Rig.objects.create(name="r", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.r")
    client = _client(owner)
    for method, url in (
        ("get", "/board/rigs/"), ("get", "/board/rigs/new"), ("post", f"/board/rigs/{rig.pk}/"),
        ("post", f"/board/rigs/{rig.pk}/delete"), ("post", f"/board/rigs/{rig.pk}/agent-key"),
        ("get", f"/monitoring/rigs/{rig.pk}/profile/"),
    ):  # fmt: skip
        assert getattr(client, method)(url).status_code == 404, url
    rig.refresh_from_db()
    assert not rig.agent_key


RIG_FORM = {"name": "gpu-box", "kind": "llamacpp", "base_url": "http://127.0.0.1:9", "slots": 2, "enabled": "on"}


def test_staff_cannot_add_a_rig(plain_staff):
    response = _client(plain_staff).post("/board/rigs/new", RIG_FORM)
    assert response.status_code == 403 and "Only a superuser may add a rig" in response.content.decode()
    assert not Rig.objects.exists()


@pytest.mark.parametrize(
    ("change", "named"), [({"base_url": "http://evil.example:8080"}, "base_url"), ({"kind": "ollama"}, "kind")]
)
def test_staff_cannot_change_a_rigs_url_or_kind_but_may_edit_the_rest(plain_staff, change, named):
    rig = Rig.objects.create(name="gpu-box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.gpu-box")
    client = _client(plain_staff)
    response = client.post(f"/board/rigs/{rig.pk}/", {**RIG_FORM, **change})
    assert response.status_code == 403
    assert f"Only a superuser may change a rig&#x27;s {named}" in response.content.decode()
    rig.refresh_from_db()
    assert (rig.kind, rig.base_url, rig.slots) == ("llamacpp", "http://127.0.0.1:9", 4)
    assert client.post(f"/board/rigs/{rig.pk}/", {**RIG_FORM, "slots": 3}).status_code == 302
    rig.refresh_from_db()
    assert (rig.base_url, rig.slots) == ("http://127.0.0.1:9", 3)


def test_a_superuser_changes_a_rigs_url(staff):
    rig = Rig.objects.create(name="gpu-box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.gpu-box")
    response = _client(staff).post(f"/board/rigs/{rig.pk}/", {**RIG_FORM, "base_url": "http://127.0.0.1:10"})
    assert response.status_code == 302
    rig.refresh_from_db()
    assert rig.base_url == "http://127.0.0.1:10"


def test_in_django_admin_a_rigs_url_and_kind_are_read_only_to_staff(plain_staff):
    from django.contrib.auth.models import Permission

    plain_staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_rig", "change_rig", "view_rig"]))
    rig = Rig.objects.create(name="gpu-box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.gpu-box")
    client = _client(User.objects.get(pk=plain_staff.pk))
    assert client.get("/admin/inference/rig/add/").status_code == 403
    client.post(f"/admin/inference/rig/{rig.pk}/change/", {**RIG_FORM, "base_url": "http://evil.example:8080"})
    rig.refresh_from_db()
    assert rig.base_url == "http://127.0.0.1:9"
