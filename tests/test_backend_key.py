"""A rig's backend key (issue 56: llama-server --api-key): set by a superuser through the rig form, never shown back,
audited as "set", and sent as a bearer token by every request RigDash makes to the backend: the chat stream through
the real worker, the sampler's /slots, /metrics and /props, the model list. Against the real llama-server started with
--api-key; without the key it answers 401, which RigDash reports instead of a rig that looks empty."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client

from inference.backends import backend_for
from inference.models import AuditLog, Rig, Turn
from inference.turns import submit
from monitoring.sampling import RigSampler
from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests.adminkit import make_user
from tests.conftest import LOG_DIR, TEST_QUEUE, wait_until

KEY = "sk-rig-" + "k" * 24

pytestmark = [pytest.mark.llama]


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    port = free_port()
    stack = Stack()
    proc = stack.start(
        "llama-keyed", llama_server_command(port=port, slots=2, ctx=2048, extra=("--api-key", KEY)),
        log_path=LOG_DIR / "llama-keyed.log",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
    yield f"http://127.0.0.1:{port}"
    stack.stop()


@pytest.mark.django_db
def test_the_key_is_set_in_the_form_never_shown_and_audited_as_set(keyed_url):
    boss = make_user("boss", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(boss)
    form = {"name": "keyed", "kind": "llamacpp", "base_url": keyed_url, "slots": "2", "enabled": "on",
            "backend_key": KEY}  # fmt: skip
    response = client.post("/board/rigs/new", form)
    assert response.status_code == 302, response.content.decode()[:500]
    rig = Rig.objects.get(name="keyed")
    assert rig.api_key == KEY
    page = client.get(f"/board/rigs/{rig.pk}/").content.decode()
    assert KEY not in page and 'name="backend_key"' in page
    record = AuditLog.objects.filter(action="rig.create").latest("id")
    assert record.detail["api_key"] == "set" and KEY not in str(record.detail)
    # Saving the form again with the key left empty keeps it; "remove" clears it.
    client.post(f"/board/rigs/{rig.pk}/", {**form, "backend_key": ""})
    assert Rig.objects.get(pk=rig.pk).api_key == KEY
    client.post(f"/board/rigs/{rig.pk}/", {**form, "backend_key": "", "clear_backend_key": "on"})
    assert Rig.objects.get(pk=rig.pk).api_key == ""
    # A key with a line break (a header injection) is refused.
    bad = client.post(f"/board/rigs/{rig.pk}/", {**form, "backend_key": "a\r\nX-Evil: 1"})
    assert bad.status_code == 400 and Rig.objects.get(pk=rig.pk).api_key == ""
    # Staff may not set it: where a rig's chats go, and the key that opens it, are a superuser's.
    staff = Client()
    staff.force_login(make_user("helper", is_staff=True))
    refused = staff.post(f"/board/rigs/{rig.pk}/", {**form, "backend_key": "other-key-123"})
    assert refused.status_code in (400, 403) and Rig.objects.get(pk=rig.pk).api_key == ""


@pytest.mark.django_db
def test_the_backend_and_the_sampler_send_the_key(keyed_url):
    assert httpx.get(f"{keyed_url}/v1/models").status_code == 401  # the server does want a key
    rig = Rig.objects.create(name="keyed2", kind=Rig.Kind.LLAMACPP, base_url=keyed_url, queue="rig.keyed2", api_key=KEY)
    models = asyncio.run(backend_for(rig).list_models())
    assert models and models[0].name
    sample = asyncio.run(RigSampler(rig=rig, bandwidth_gbs=25.0).take())
    assert sample.detail["sources"]["backend"]["ok"], sample.detail["sources"]
    assert "backend_slots" not in sample.detail["sources"] and sample.series["total_slots"] == 2
    assert "llamacpp_n_decode_total" in sample.series  # /metrics answered with the key
    rig.api_key = ""
    without = asyncio.run(RigSampler(rig=rig, bandwidth_gbs=25.0).take())
    refused = {name: s["error"] for name, s in without.detail["sources"].items() if not s["ok"]}
    assert any("401" in error for error in refused.values()), refused


@pytest.mark.django_db(transaction=True)
def test_a_chat_through_the_real_worker_reaches_the_keyed_server(celery_worker, keyed_url, owner, model_name):
    from inference.models import ChatSession

    rig = Rig.objects.create(name="keyed3", kind=Rig.Kind.LLAMACPP, base_url=keyed_url, queue=TEST_QUEUE,
                             api_key=KEY)  # fmt: skip
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
    turn = submit.turn_submit(session=session, text="Say hi.", params={"max_tokens": 8, "temperature": 0})
    wait_until(lambda: Turn.objects.get(pk=turn.pk).status not in Turn.ACTIVE, timeout_s=90, what="the turn's end")
    done: Any = Turn.objects.get(pk=turn.pk)
    assert done.status == Turn.Status.DONE, (done.status, done.error, done.stats.get("error_detail"))
    assert done.reply_text.strip()
