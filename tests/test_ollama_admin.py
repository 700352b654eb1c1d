"""Model management (staff only): routes refuse everyone else with 404; pull, delete and unload work.

No Ollama binary can run here: the rig points at tests/ollama_replay.py, a protocol replay of Ollama's API;
the Celery worker, Redis, PostgreSQL and Channels are real.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from inference.backends.base import ChatRequest
from inference.backends.ollama import OllamaBackend
from inference.models import AuditLog, ChatSession, Rig, Turn
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.wsclient import ModelsSocket

MODEL = "smollm2:135m"


@pytest.fixture
def ollama_rig(db, ollama):
    # The test worker consumes TEST_QUEUE; these tests do not use the llama.cpp ``rig`` fixture that shares it.
    return Rig.objects.create(name="ollama-admin", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)


def _client(user: Any | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _post(client: Client, rig: Rig, action: str, body: Any) -> Any:
    return client.post(f"/api/rigs/{rig.pk}/models/{action}", json.dumps(body), content_type="application/json")


def _routes(client: Client, rig: Rig) -> dict[str, Any]:
    return {
        "page": client.get(f"/rigs/{rig.pk}/models/"),
        "state": client.get(f"/api/rigs/{rig.pk}/models/state"),
        "pull": _post(client, rig, "pull", {"model": "tinyllama"}),
        "delete": _post(client, rig, "delete", {"model": MODEL}),
        "unload": _post(client, rig, "unload", {"model": MODEL}),
    }


@pytest.mark.django_db
def test_ordinary_user_gets_404_from_every_route_and_nothing_happens(other_user, ollama_rig, ollama):
    for route, response in _routes(_client(other_user), ollama_rig).items():
        assert response.status_code == 404, route
        assert MODEL.encode() not in response.content, route
    assert [path for _, path, _ in ollama.requests] == []  # not even a read reached the backend


@pytest.mark.django_db
def test_anonymous_is_sent_to_login_or_refused(ollama_rig, ollama):
    responses = _routes(_client(None), ollama_rig)
    assert responses.pop("page").status_code == 302
    assert all(response.status_code == 401 for response in responses.values())
    assert ollama.requests == []


@pytest.mark.django_db(transaction=True)
async def test_models_socket_refuses_ordinary_and_anonymous_users(ollama_rig, other_user, admin_user):
    refused = ModelsSocket(ollama_rig.pk, await sync_to_async(session_cookie_for)(other_user))
    assert await refused.comm.connect(timeout=10) == (False, 4404)
    anonymous = ModelsSocket(ollama_rig.pk, None)
    assert (await anonymous.comm.connect(timeout=10))[0] is False
    missing = ModelsSocket(ollama_rig.pk + 1000, await sync_to_async(session_cookie_for)(admin_user))
    assert await missing.comm.connect(timeout=10) == (False, 4404)


@pytest.mark.django_db
def test_admin_page_lists_installed_and_loaded_models(admin_user, ollama_rig, ollama):
    client = _client(admin_user)
    page = client.get(f"/rigs/{ollama_rig.pk}/models/")
    assert page.status_code == 200
    html = page.content.decode()
    assert MODEL in html and 'data-testid="pull-form"' in html and "Nothing is loaded." in html
    state = client.get(f"/api/rigs/{ollama_rig.pk}/models/state").json()
    assert [m["name"] for m in state["models"]] == [MODEL]
    assert state["capabilities"] == {"pull": True, "delete": True, "load": False, "unload": True, "loaded": True}
    assert state["errors"] == []


@pytest.mark.django_db(transaction=True)
async def test_admin_pull_reports_progress_over_the_websocket(celery_worker, admin_user, ollama_rig, ollama):
    ollama.pull_step_s = 0.1  # 0.6 s a layer: the worker sends a few steps a second, so some mid-layer ones
    sock = ModelsSocket(ollama_rig.pk, await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.comm.connect(timeout=10))[0]
    client = await sync_to_async(_client)(admin_user)
    response = await sync_to_async(_post)(client, ollama_rig, "pull", {"model": " tinyllama "})
    assert response.status_code == 202
    pull = response.json()["pull"]
    assert pull["model"] == "tinyllama"
    end = await sock.recv_until(lambda f: f["type"] == "pull.end")
    await sock.comm.disconnect()

    assert end == {"type": "pull.end", "rig": ollama_rig.pk, "pull": pull["id"], "model": "tinyllama",
                   "ok": True, "error": None}  # fmt: skip
    progress = [f for f in sock.frames if f["type"] == "pull.progress"]
    assert all(f["pull"] == pull["id"] for f in progress)
    assert progress[0]["status"] == "pulling manifest" and progress[-1]["status"] == "success"
    downloads = [f for f in progress if f["total"]]
    digests = {f["digest"] for f in downloads}
    assert len(digests) == 2, "each layer's download is reported"
    assert any(0 < (f["completed"] or 0) < f["total"] for f in downloads), "no partial progress to draw a bar from"
    assert all(any(f["digest"] == d and f["completed"] == f["total"] for f in downloads) for d in digests)
    state = (await sync_to_async(client.get)(f"/api/rigs/{ollama_rig.pk}/models/state")).json()
    assert "tinyllama:latest" in [m["name"] for m in state["models"]]


@pytest.mark.django_db(transaction=True)
async def test_pull_of_a_name_the_registry_lacks_ends_with_a_clear_error(celery_worker, admin_user, ollama_rig, ollama):
    sock = ModelsSocket(ollama_rig.pk, await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.comm.connect(timeout=10))[0]
    client = await sync_to_async(_client)(admin_user)
    response = await sync_to_async(_post)(client, ollama_rig, "pull", {"model": "no-such-model:7b"})
    assert response.status_code == 202
    end = await sock.recv_until(lambda f: f["type"] == "pull.end")
    await sock.comm.disconnect()
    assert end["ok"] is False and end["error"]["code"] == "unknown_model"
    assert "no-such-model:7b" in end["error"]["message"] and "file does not exist" in end["error"]["message"]


@pytest.mark.django_db
def test_bad_pull_input_is_refused_before_anything_is_queued(admin_user, ollama_rig, ollama):
    client = _client(admin_user)
    for body in ({"model": "bad name"}, {"model": ""}, {"model": 7}, {}, ["tinyllama"], {"model": "x" * 201}):
        response = _post(client, ollama_rig, "pull", body)
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] in ("bad_model_name", "bad_json"), body
    garbled = client.post(f"/api/rigs/{ollama_rig.pk}/models/pull", "{not json", content_type="application/json")
    assert garbled.status_code == 400 and garbled.json()["error"]["code"] == "bad_json"
    assert client.get(f"/api/rigs/{ollama_rig.pk}/models/pull").status_code == 405
    assert ollama.requests == []


@pytest.mark.django_db(transaction=True)
async def test_admin_delete_removes_the_model_and_tells_open_pages(admin_user, ollama_rig, ollama):
    sock = ModelsSocket(ollama_rig.pk, await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.comm.connect(timeout=10))[0]
    client = await sync_to_async(_client)(admin_user)
    response = await sync_to_async(_post)(client, ollama_rig, "delete", {"model": MODEL})
    assert response.status_code == 200 and response.json() == {"deleted": MODEL}
    changed = await sock.recv_until(lambda f: f["type"] == "models.changed", timeout=10)
    await sock.comm.disconnect()
    assert changed["action"] == "deleted" and changed["model"] == MODEL
    assert MODEL not in ollama.models
    unload = next(body for method, path, body in ollama.requests if path == "/api/generate")
    assert unload["keep_alive"] == 0  # unloaded first, as `ollama rm` does

    again = await sync_to_async(_post)(client, ollama_rig, "delete", {"model": MODEL})
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_model"
    audited = [entry async for entry in AuditLog.objects.filter(action="model.delete")]
    assert [(e.actor_name, e.target, e.detail["model"]) for e in audited] == [("admin", f"rig:{ollama_rig.pk}", MODEL)]


@pytest.mark.django_db
def test_delete_of_a_model_a_chat_is_using_is_refused(admin_user, owner, ollama_rig, ollama):
    session = ChatSession.objects.create(owner=owner, rig=ollama_rig, model_name=MODEL)
    Turn.objects.create(session=session, user_text="hi", status=Turn.Status.DECODING)
    response = _post(_client(admin_user), ollama_rig, "delete", {"model": MODEL})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "model_in_use" and MODEL in error["message"]
    assert MODEL in ollama.models and not [p for _, p, _ in ollama.requests if p == "/api/delete"]


@pytest.mark.django_db
def test_admin_unload_frees_a_loaded_model(admin_user, ollama_rig, ollama):
    async def chat():
        request = ChatRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        return [chunk async for chunk in OllamaBackend(ollama.url).stream_chat(request)]

    asyncio.run(chat())  # loads the model, as a chat turn would
    client = _client(admin_user)
    assert [m["name"] for m in client.get(f"/api/rigs/{ollama_rig.pk}/models/state").json()["loaded"]] == [MODEL]
    response = _post(client, ollama_rig, "unload", {"model": MODEL})
    assert response.status_code == 200 and response.json() == {"unloaded": MODEL}
    assert client.get(f"/api/rigs/{ollama_rig.pk}/models/state").json()["loaded"] == []
    unknown = _post(client, ollama_rig, "unload", {"model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_model"
    assert list(AuditLog.objects.values_list("action", flat=True)) == ["model.unload"]  # the failed one is not


@pytest.mark.django_db
def test_unreachable_ollama_shows_a_clear_error_and_nothing_breaks(admin_user, ollama_rig, ollama):
    ollama.refuse_connections()
    client = _client(admin_user)
    page = client.get(f"/rigs/{ollama_rig.pk}/models/")
    assert page.status_code == 200
    assert b"Cannot list the installed models: Ollama is unreachable" in page.content
    state = client.get(f"/api/rigs/{ollama_rig.pk}/models/state").json()
    assert state["models"] == [] and len(state["errors"]) == 2
    for action in ("delete", "unload"):
        response = _post(client, ollama_rig, action, {"model": MODEL})
        assert response.status_code == 502, action
        assert response.json()["error"]["code"] == "backend_unavailable", action
    assert client.get("/").status_code == 200  # the rest of RigDash carries on


@pytest.mark.django_db
@pytest.mark.llama
def test_llamacpp_rig_page_lists_its_model_and_refuses_management(admin_user, rig, model_name):
    client = _client(admin_user)
    page = client.get(f"/rigs/{rig.pk}/models/")
    assert page.status_code == 200 and model_name.encode() in page.content
    assert b'data-testid="not-supported"' in page.content and b'data-testid="pull-form"' not in page.content
    for action in ("pull", "delete", "unload"):
        response = _post(client, rig, action, {"model": model_name})
        assert response.status_code == 400 and response.json()["error"]["code"] == "not_supported", action


@pytest.mark.django_db
def test_staff_see_a_link_to_manage_models(admin_user, other_user, ollama_rig):
    assert b'data-testid="manage-models"' in _client(admin_user).get("/").content
    assert b'data-testid="manage-models"' not in _client(other_user).get("/").content
