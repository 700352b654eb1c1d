"""Rig URLs name any host a container network or LAN uses; the queue follows the name; bootstrap leaves an
admin's edits alone."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client

from inference.bootstrap import rig_from_env
from inference.forms import RigForm
from inference.models import Rig
from inference.validators import validate_backend_url

GOOD = [
    "http://ollama:11434",
    "http://llamacpp:8080",
    "http://gpu-box.lan:8080",
    "http://[::1]:8081",
    "http://[fe80::1]",
    "https://rig.example.com/llama/",
    "http://127.0.0.1:8081",
    "http://host.docker.internal:11434",
    "http://my_ollama:11434",
    "http://localhost",
]
BAD = [
    "ollama:11434",
    "ftp://ollama:21",
    "http://",
    "http://:8080",
    "http://ollama:0",
    "http://ollama:65536",
    "http://ollama:port",
    "http://ollama:",
    "http://user:secret@ollama:11434",
    "http://ollama:11434/?a=1",
    "http://ollama:11434/#x",
    "http://-bad-:80",
    "http://bad..host:80",
    "http://[not-ipv6]:80",
    "http://oll ama:11434",
    " http://ollama:11434",
    "javascript:alert(1)",
]


@pytest.mark.parametrize("url", GOOD)
def test_container_and_lan_hosts_are_valid(url):
    validate_backend_url(url)


@pytest.mark.parametrize("url", BAD)
def test_malformed_urls_are_refused(url):
    with pytest.raises(ValidationError):
        validate_backend_url(url)


def _form(**data):
    return RigForm(data={"name": "ollama", "kind": "ollama", "base_url": "http://ollama:11434", "slots": 4,
                         "enabled": "on", **data})  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["http://ollama:11434", "http://llamacpp:8080", "http://gpu-box.lan:8080",
                                 "http://[::1]:8081"])  # fmt: skip
def test_single_label_hosts_save_through_the_form_with_a_derived_queue(url):
    form = _form(base_url=url)
    assert form.is_valid(), form.errors
    rig = form.save()
    rig.refresh_from_db()
    assert (rig.base_url, rig.queue) == (url, "rig.ollama")


@pytest.mark.django_db
def test_the_form_refuses_a_bad_url_and_stores_nothing():
    form = _form(base_url="http://user:pw@ollama:11434")
    assert not form.is_valid()
    assert "base_url" in form.errors
    assert not Rig.objects.exists()


@pytest.mark.django_db
def test_the_queue_cannot_be_typed_and_follows_a_rename():
    form = _form(queue="typed.by.hand")
    assert form.is_valid(), form.errors
    rig = form.save()
    assert rig.queue == "rig.ollama"
    form = RigForm(instance=rig, data={**form.data, "name": "big-box"})
    assert form.is_valid(), form.errors
    assert form.save().queue == "rig.big-box"


@pytest.mark.django_db
def test_a_rig_saved_in_code_without_a_queue_gets_its_name_s():
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://box:8080")
    assert rig.queue == "rig.box"


@pytest.mark.django_db
def test_django_admin_saves_a_single_label_host_and_shows_the_queue_read_only(admin_user):
    """The bootstrapped rig at http://llamacpp:8080 can be edited, disabled and saved in /admin/."""
    rig, _ = rig_from_env(name="embedded", kind="llamacpp", base_url="http://llamacpp:8080", slots=4, is_default=True)
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/admin/inference/rig/{rig.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="queue"' not in html and "rig.embedded" in html
    response = client.post(
        f"/admin/inference/rig/{rig.pk}/change/",
        {"name": "embedded", "kind": "llamacpp", "base_url": "http://gpu-box.lan:8080", "slots": 2,
         "is_default": "on", "queue": "hand.typed"},  # enabled left out: disabled
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    rig.refresh_from_db()
    assert (rig.base_url, rig.slots, rig.enabled, rig.queue) == ("http://gpu-box.lan:8080", 2, False, "rig.embedded")
    response = client.post(
        "/admin/inference/rig/add/",
        {"name": "ollama", "kind": "ollama", "base_url": "http://ollama:11434", "slots": 4, "enabled": "on"},
    )
    assert response.status_code == 302
    assert Rig.objects.get(name="ollama").queue == "rig.ollama"


@pytest.mark.django_db
def test_bootstrap_follows_the_environment_until_an_admin_edits_the_rig():
    rig, kept = rig_from_env(name="embedded", kind="llamacpp", base_url="http://llamacpp:8080", slots=4)
    assert (rig.base_url, rig.slots, rig.queue, kept) == ("http://llamacpp:8080", 4, "rig.embedded", [])
    # The environment moves (scripts/run on another port): the rig follows.
    rig, kept = rig_from_env(name="embedded", kind="llamacpp", base_url="http://127.0.0.1:8082", slots=4)
    assert (rig.base_url, kept) == ("http://127.0.0.1:8082", [])
    # An admin points it elsewhere: the next starts keep that, whatever the environment says; slots still follow.
    Rig.objects.filter(pk=rig.pk).update(base_url="http://gpu-box.lan:8080")
    for url in ("http://127.0.0.1:8082", "http://127.0.0.1:8083"):
        rig, kept = rig_from_env(name="embedded", kind="llamacpp", base_url=url, slots=6)
        assert (rig.base_url, rig.slots, kept) == ("http://gpu-box.lan:8080", 6, ["base_url"])
    rig.refresh_from_db()
    assert rig.base_url == "http://gpu-box.lan:8080"


@pytest.mark.django_db
def test_a_rig_bootstrapped_before_the_record_follows_once_then_is_remembered():
    Rig.objects.create(name="embedded", kind="llamacpp", base_url="http://127.0.0.1:8081", queue="rig.embedded")
    rig, kept = rig_from_env(name="embedded", kind="llamacpp", base_url="http://llamacpp:8080", slots=4)
    assert (rig.base_url, kept, rig.bootstrapped) == ("http://llamacpp:8080", [], {"base_url": "http://llamacpp:8080",
                                                                                   "slots": 4})  # fmt: skip


@pytest.mark.django_db
def test_bootstrap_command_names_rigs_from_the_environment(monkeypatch, settings, capsys):
    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, default_rig_url="")
    monkeypatch.setenv("RIGDASH_OLLAMA_URL", "http://host.docker.internal:11434")
    monkeypatch.setenv("RIGDASH_ADMIN_PASSWORD", "a-long-admin-password")
    call_command("rigdash_bootstrap")
    out = capsys.readouterr().out
    assert "default rig: none" in out
    ollama = Rig.objects.get()
    assert (ollama.name, ollama.kind, ollama.queue, ollama.is_default) == ("ollama", "ollama", "rig.ollama", True)
    monkeypatch.setenv("RIGDASH_OLLAMA_URL", "not a url")
    with pytest.raises(ValidationError):
        call_command("rigdash_bootstrap")
