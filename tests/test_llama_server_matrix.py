"""RigDash's llama.cpp monitor against llama-server as people start it (issue 55): defaults (only ``-m``), ``-np 1``,
``-np 4`` (a cache stream per slot), ``-np 4 -kvu``, ``--metrics``, router mode over a directory of tiny GGUFs, sleep
mode. Each: the backend is up (a refused endpoint is a named missing panel), the KV allocated equals the cache
llama-server logs (``llama_kv_cache: size = ... MiB``), and a chat works. Tiny models (tests/tiny_gguf.py), short
replies, one thread."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.backends.base import ChatRequest
from inference.backends.llamacpp import LlamaCppBackend, LlamaCppMonitor
from inference.backends.monitor import MonitorContext
from inference.models import Rig
from rigdash.launcher import Stack, free_port, wait_http
from tests import tiny_gguf

MIB = 1024 * 1024
SIZE = re.compile(r"llama_kv_cache: size = +(?P<mib>[\d.]+) MiB")


def _logged_mib(log: str) -> list[float]:
    return [float(m["mib"]) for m in SIZE.finditer(log)]


@pytest.fixture
def server(tmp_path: Path) -> Any:
    stack = Stack()

    def start(*args: str) -> tuple[str, Path]:
        import os

        port, log = free_port(), tmp_path / f"server-{len(stack.procs)}.log"
        cmd = [os.environ["LLAMA_SERVER_BIN"], "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-tb", "1",
               "-lv", "4", "--no-webui", *args]  # fmt: skip
        proc = stack.start("llama-server", cmd, log_path=log)
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60, proc=proc)
        return f"http://127.0.0.1:{port}", log

    yield start
    stack.stop()


def _sample(url: str) -> tuple[dict[str, float], dict[str, Any]]:
    monitor = LlamaCppMonitor(MonitorContext(rig=Rig(name="m", kind="llamacpp", base_url=url), local_host=True))
    series: dict[str, float] = {}
    detail: dict[str, Any] = {"sources": {}, "provenance": {}}
    asyncio.run(monitor.read(time.time(), series, detail))
    monitor.kv(series, detail)
    return series, detail


def _chat(url: str, model: str) -> str:
    async def run() -> str:
        chunks = LlamaCppBackend(url).stream_chat(
            ChatRequest(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1)
        )
        finish = ""
        async for chunk in chunks:
            finish = chunk.finish_reason or finish
        return finish

    return asyncio.run(run())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf.write_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", *tiny_gguf.llama_gqa(layers=4, kv_heads=1))


@pytest.mark.parametrize(
    ("flags", "slots", "unified", "refused"),
    [
        ((), 4, True, {"backend_metrics"}),  # defaults: -np auto = 4 slots over one unified cache, no /metrics
        (("-np", "1"), 1, False, {"backend_metrics"}),
        (("-np", "4"), 4, False, {"backend_metrics"}),  # one stream per slot: each slot a quarter of -c
        (("-np", "4", "-kvu"), 4, True, {"backend_metrics"}),
        (("--metrics",), 4, True, set()),
    ],
    ids=["defaults", "np1", "np4", "np4-kvu", "metrics"],
)
def test_one_model_server(server, model, flags, slots, unified, refused) -> None:
    url, log = server("-m", str(model), "-c", "3000", *flags)
    series, detail = _sample(url)
    sources = detail["sources"]
    assert sources["backend"]["ok"] and sources["kv"]["ok"], sources
    assert {name for name, s in sources.items() if not s["ok"]} == refused, sources
    assert series["total_slots"] == slots and detail["kv"]["layout"]["unified"] == (unified and slots > 1)
    logged = _logged_mib(log.read_text())
    assert abs(series["kv_allocated_bytes"] - sum(logged) * MIB) <= 0.005 * MIB * len(logged), (
        series["kv_allocated_bytes"] / MIB,
        logged,
    )
    assert _chat(url, "tiny") in ("length", "stop")


def test_router_mode_models_loaded_on_demand_each_with_its_kv(server, tmp_path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    tiny_gguf.write_gguf(models / "alpha.gguf", *tiny_gguf.llama_gqa(layers=4, kv_heads=1))
    tiny_gguf.write_gguf(models / "beta.gguf", *tiny_gguf.qwen3(layers=3, kv_heads=2, head=48))
    tiny_gguf.write_gguf(models / "gamma.gguf", *tiny_gguf.llama_gqa(layers=2, kv_heads=2))
    url, log = server("--models-dir", str(models), "-c", "1024")
    backend = LlamaCppBackend(url)
    series, detail = _sample(url)
    assert detail["sources"]["backend"]["ok"] and detail["sources"]["kv"]["ok"], detail["sources"]
    assert {m["name"]: m["status"] for m in detail["models"]} == {"alpha": "unloaded", "beta": "unloaded",
                                                                   "gamma": "unloaded"}  # fmt: skip
    assert series["kv_allocated_bytes"] == 0 and series["models_loaded"] == 0
    assert asyncio.run(backend.loaded_models()) == []
    asyncio.run(backend.load_model("alpha"))
    assert _chat(url, "beta") in ("length", "stop")  # a chat for an unloaded model loads it
    assert sorted(m.name for m in asyncio.run(backend.loaded_models())) == ["alpha", "beta"]
    series, detail = _sample(url)
    assert {m["name"]: m["status"] for m in detail["models"]}["gamma"] == "unloaded"  # never asked about: not loaded
    assert series["total_slots"] == 8 and {s["model"] for s in detail["slots"]} == {"alpha", "beta"}
    logged = _logged_mib(log.read_text())
    assert len(logged) == 2
    assert abs(series["kv_allocated_bytes"] - sum(logged) * MIB) <= 0.01 * MIB, (series["kv_allocated_bytes"], logged)
    asyncio.run(backend.unload_model("alpha"))
    time.sleep(0.5)
    series, detail = _sample(url)
    assert [m.name for m in asyncio.run(backend.loaded_models())] == ["beta"]
    assert abs(series["kv_allocated_bytes"] - _logged_mib(log.read_text())[1] * MIB) <= 0.005 * MIB


def test_a_sleeping_server_is_not_woken(server, model) -> None:
    url, log = server("-m", str(model), "-c", "1024", "--sleep-idle-seconds", "1")
    wait_until_asleep = time.monotonic() + 20
    while not httpx.get(f"{url}/props").json().get("is_sleeping"):
        assert time.monotonic() < wait_until_asleep
        time.sleep(0.2)
    for _ in range(3):
        series, detail = _sample(url)
    assert detail["sources"]["backend"]["ok"] and detail.get("sleeping"), detail["sources"]
    assert not detail["sources"]["backend_slots"]["ok"]  # named, not read
    assert series["kv_allocated_bytes"] == 0  # asleep: the model and its cache are freed
    assert httpx.get(f"{url}/props").json()["is_sleeping"]  # still asleep after the samples
    assert "exiting sleeping state" not in log.read_text()
    assert _chat(url, "tiny") in ("length", "stop")  # a request wakes it
    series, detail = _sample(url)
    assert not detail.get("sleeping") and series["kv_allocated_bytes"] == _logged_mib(log.read_text())[-1] * MIB


@pytest.mark.django_db
def test_staff_load_and_unload_a_routers_models_from_the_rig_page(server, tmp_path) -> None:
    """The rig's model page (inference/board/model_admin.py) on a router: Load and Unload over its JSON API, as the
    page's buttons send them, and the overview shows which installed model can be loaded."""
    import json

    from django.test import Client

    from inference.models import Rig as RigRow
    from tests.adminkit import make_user

    models = tmp_path / "models"
    models.mkdir()
    tiny_gguf.write_gguf(models / "alpha.gguf", *tiny_gguf.llama_gqa(layers=2, kv_heads=1))
    tiny_gguf.write_gguf(models / "beta.gguf", *tiny_gguf.llama_gqa(layers=2, kv_heads=2))
    url, _log = server("--models-dir", str(models), "-c", "512")
    rig = RigRow.objects.create(name="router", kind=RigRow.Kind.LLAMACPP, base_url=url, queue="rig.router")
    client = Client()
    client.force_login(make_user("boss", is_staff=True))
    api = f"/api/rigs/{rig.pk}/models"
    state = client.get(f"{api}/state").json()
    assert state["capabilities"]["load"] and state["loaded_names"] == []
    response = client.post(f"{api}/load", json.dumps({"model": "alpha"}), content_type="application/json")
    assert response.status_code == 200, response.content
    assert client.get(f"{api}/state").json()["loaded_names"] == ["alpha"]
    response = client.post(f"{api}/unload", json.dumps({"model": "alpha"}), content_type="application/json")
    assert response.status_code == 200, response.content
    time.sleep(0.5)
    assert client.get(f"{api}/state").json()["loaded_names"] == []
    missing = client.post(f"{api}/load", json.dumps({"model": "nope"}), content_type="application/json")
    assert missing.status_code >= 400 and missing.json()["error"]["message"]
    user = Client()
    user.force_login(make_user("someone"))
    assert user.post(f"{api}/load", json.dumps({"model": "beta"}), content_type="application/json").status_code == 404
