"""RigDash against an older llama-server, started as its users start one: only ``-m`` (plus host, port and threads),
and again with ``--metrics``. The build is pinned in scripts/lib.sh (``LLAMA_SERVER_OLD_VERSION``); scripts/test
builds it beside the embedded one and names it in ``LLAMA_SERVER_OLD_BIN``.

Everything goes through RigDash's real stack: the sampler's loop (which stores its samples and records the server's
slots into ``Rig.server_slots``), the web server and the Celery worker with a real API key. Each figure is checked
against what that server itself says (``/props``, ``/slots``, ``/metrics``, its log's KV cache size, its direct
answer to the same request); a figure the server does not give is reported as unknown with the reason, never as a
number. Short replies, greedy (temperature 0, a seed), SmolLM2."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from django.test import Client

from inference.models import Rig
from inference.turns import board_rows
from monitoring import sampler
from monitoring.models import RigSample
from rigdash.launcher import Stack
from tests.conftest import wait_until
from tests.test_browser import browser, login, page  # noqa: F401  (fixtures)
from tests.test_gateway_server_matrix import (
    GREEDY,
    HI,
    TOOLS,
    Gateway,
    Server,
    _all_turns_of_the_key,
    _rig,
    _same_answers,
    _text,
)

OLD_BIN = os.environ.get("LLAMA_SERVER_OLD_BIN", "")
pytestmark = [
    pytest.mark.llama,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not OLD_BIN, reason="LLAMA_SERVER_OLD_BIN is not set: scripts/test builds the older server"),
]
KV_LOGGED = re.compile(r"llama_kv_cache: size = +(?P<mib>[\d.]+) MiB")
STORY = [{"role": "user", "content": "Write a long story about a cat."}]
PROMPT_COUNTERS = ("n_prompt_tokens_processed", "n_prompt_tokens_cache")


@pytest.fixture(scope="module")
def old_servers() -> Iterator[dict[str, Server]]:
    stack = Stack()
    smol = os.environ["LLAMA_MODEL_PATH"]
    try:
        yield {
            "defaults": Server(stack, "old-defaults", "-m", smol, binary=OLD_BIN, own=()),
            "metrics": Server(stack, "old-metrics", "-m", smol, "--metrics", binary=OLD_BIN, own=()),
        }
    finally:
        stack.stop()


def _samples(rig: Rig, ticks: int) -> list[RigSample]:
    """``ticks`` samples by the sampler's own loop (stored, published, the server's slots recorded), oldest first."""
    before = RigSample.objects.filter(rig=rig).count()
    asyncio.run(sampler.rig_loop(rig.pk, interval_s=0.3, ticks=ticks))
    rig.refresh_from_db()
    return list(RigSample.objects.filter(rig=rig).order_by("ts"))[before:]


def _own(server: Server, path: str) -> Any:
    response = httpx.get(f"{server.url}{path}", timeout=10)
    return response.json() if path != "/metrics" else response.text


@contextmanager
def _long_reply(server: Server) -> Iterator[None]:
    """A long reply straight to the server (another client), decoding while the block runs."""
    body = {"messages": STORY, "max_tokens": 400, "stream": True, **GREEDY}
    thread = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120))
    thread.start()
    try:
        wait_until(lambda: any(_decoded(slot) > 0 for slot in _own(server, "/slots") if slot["is_processing"]),
                   timeout_s=60, what="the server decoding the long reply")  # fmt: skip
        yield
    finally:
        thread.join(120)


def _decoded(slot: dict[str, Any]) -> int:
    next_token = slot.get("next_token") or [{}]
    return int((next_token[0] if isinstance(next_token, list) else next_token).get("n_decoded") or 0)


@pytest.mark.parametrize("flags", ["defaults", "metrics"])
def test_the_sampler_reads_an_older_server_and_names_what_it_cannot_tell(old_servers, flags) -> None:
    server = old_servers[flags]
    rig = _rig(f"old-{flags}", server)
    (idle,) = _samples(rig, 1)
    props = _own(server, "/props")
    sources = idle.detail["sources"]
    assert sources["backend"]["ok"], sources
    assert rig.server_slots == idle.detail["server_slots"] == props["total_slots"] == idle.series["total_slots"]
    assert idle.series["busy_slots"] == 0 and idle.series["kv_used_bytes"] == 0 == idle.series["context_tokens"]
    logged = [float(m["mib"]) for m in KV_LOGGED.finditer(server.log.read_text())][-1]  # this run's: the last
    assert idle.series["kv_allocated_bytes"] == logged * 2**20
    metrics = _own(server, "/metrics")
    if flags == "metrics":
        predicted = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", metrics, re.M)
        assert predicted and idle.series["llamacpp_tokens_predicted_total"] == float(predicted[1])
    else:
        assert "backend_metrics" in sources and "501" in sources["backend_metrics"]["error"], sources
    spec = "llamacpp:spec_decode_num_draft_tokens_total" in metrics
    assert ("llamacpp_spec_decode_num_draft_tokens_total" in idle.series) == spec

    with _long_reply(server):
        busy = _samples(rig, 2)
        own = _own(server, "/slots")
    working = [slot for slot in own if slot["is_processing"]]
    assert len(working) == 1, own
    for sample in busy:
        assert sample.detail["sources"]["backend"]["ok"]
        assert sample.series["busy_slots"] == 1 and sample.series["total_slots"] == len(own)
        assert [(s["id"], s["n_ctx"]) for s in sample.detail["slots"]] == [(s["id"], s["n_ctx"]) for s in own]
        (slot,) = [s for s in sample.detail["slots"] if s["phase"] != "idle"]
        assert slot["id"] == working[0]["id"] and 0 < slot["decoded"] <= _decoded(working[0])
        if flags == "defaults":  # every tick names the refused /metrics, not only the ticks that read it
            assert not sample.detail["sources"]["backend_metrics"]["ok"]
        if all(name in working[0] for name in PROMPT_COUNTERS):
            held = sum(working[0][name] for name in PROMPT_COUNTERS) + _decoded(working[0])
            assert 0 < slot["context_tokens"] <= held
            continue
        # No prompt counters: the slot's context, its fill and the KV in use are unknown, never its decoded tokens.
        assert slot["context_tokens"] is None and slot["fill"] is None and slot["kv_bytes"] is None, slot
        assert "kv_used_bytes" not in sample.series and "context_tokens" not in sample.series
        assert "n_prompt_tokens" in sample.detail["sources"]["kv_used"]["error"]
        assert not sample.detail["roofline"]["ok"] and "n_prompt_tokens" in sample.detail["roofline"]["error"]
        assert any("prompt counters" in note for note in sample.detail["build"]["notes"])
        assert sample.series["kv_allocated_bytes"] == logged * 2**20
    assert busy[-1].series["decode_tps"] > 0  # the rate between the two ticks

    (after,) = _samples(rig, 1)
    assert after.series["busy_slots"] == 0 and after.series["kv_used_bytes"] == 0  # no slot holds a prompt now
    if flags == "metrics" and not spec:
        assert any("speculative" in note for note in after.detail["build"]["notes"])


@pytest.mark.browser
def test_the_rig_page_says_what_the_older_server_does_not_report(old_servers, page, web_url, admin_user) -> None:  # noqa: F811
    """The page opens on the last sample, taken while a slot decoded: its context and the KV in use are unknown, in
    words, where a number would be its decoded tokens alone."""
    server = old_servers["defaults"]
    rig = _rig("old-page", server)
    with _long_reply(server), ThreadPoolExecutor(max_workers=1) as off_loop:  # not from Playwright's loop thread
        off_loop.submit(_samples, rig, 2).result()
    if all(name in next(s for s in _own(server, "/slots") if "id_task" in s) for name in PROMPT_COUNTERS):
        pytest.skip("this build's /slots reports a busy slot's prompt tokens")
    login(page, web_url, "admin")
    page.goto(f"{web_url}/monitoring/rigs/{rig.pk}/")
    kv = page.get_by_test_id("kv-facts").inner_text()
    assert "in use unknown (" in kv and "n_prompt_tokens" in kv, kv
    assert re.search(r"decoding\s+\? / 8192\s+\N{EN DASH}", page.locator("[data-testid=slots] tbody").inner_text())
    assert "KV cache the decoding slots read is unknown" in page.get_by_test_id("roofline").inner_text()
    assert page.errors == []


def test_the_gateway_answers_as_the_older_server_does_and_counts_its_turns(old_servers, web_url, celery_worker,
                                                                          owner, llama_url) -> None:  # fmt: skip
    server = old_servers["defaults"]
    rig = _rig("old", server)
    gateway = Gateway(web_url, owner, "old-build")
    (model,) = server.models
    assert [m["id"] for m in gateway.http.get("/v1/models").json()["data"]] == [model]

    chat = {"model": model, "messages": HI, "max_tokens": 8, **GREEDY}
    assert _same_answers(server, gateway, "/v1/chat/completions", chat)
    assert "referring" not in _same_answers(server, gateway, "/v1/chat/completions", {**chat, "stop": ["referring"]})
    _same_answers(server, gateway, "/v1/chat/completions", {**chat, "tools": TOOLS, "tool_choice": "auto"})
    _same_answers(server, gateway, "/v1/completions", {"model": model, "prompt": "def add(a, b):\n", "max_tokens": 8,
                                                       **GREEDY})  # fmt: skip

    # The usage RigDash reports is the server's own: the whole prompt, the reply, the prompt's cached tokens (the
    # same request again, so the server had it cached both times).
    direct = server.post("/v1/chat/completions", chat).json()
    whole = gateway.post("/v1/chat/completions", chat).json()
    assert _text(whole) == _text(direct)
    told = {name: direct["usage"][name] for name in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert whole["usage"] == {**told, "prompt_tokens_details": direct["usage"]["prompt_tokens_details"]}
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    options = {"num_predict": 8, **GREEDY}
    ollama = gateway.post("/api/chat", {"model": model, "messages": HI, "options": options, "stream": False}).json()
    assert ollama["message"]["content"] == _text(direct), ollama
    assert (ollama["prompt_eval_count"], ollama["eval_count"]) == (told["prompt_tokens"], told["completion_tokens"])
    lines = gateway.stream("/api/chat", {"model": model, "messages": HI, "options": options})
    assert "".join(line["message"]["content"] for line in lines) == _text(direct) and lines[-1]["done"]
    assert lines[-1]["eval_count"] == told["completion_tokens"]

    # Anthropic's token count: this build has no /v1/chat/completions/input_tokens (404), so RigDash applies its
    # template and tokenizes; the figure is this server's own count_tokens, and the embedded build's (same model).
    count = {"model": model, "system": "Be brief.", "messages": [{"role": "user", "content": "Name a colour."}]}
    assert server.post("/v1/chat/completions/input_tokens", {"model": model, "messages": HI}).status_code == 404
    counted = gateway.http.post("/v1/messages/count_tokens", json=count)
    assert counted.status_code == 200, counted.text
    assert counted.json() == server.post("/v1/messages/count_tokens", count).json()
    assert counted.json() == httpx.post(f"{llama_url}/v1/messages/count_tokens", json=count, timeout=30).json()

    # llama-server's own API on this build: its last result has the fields the embedded build's has.
    native = {"model": model, "prompt": "def add(a, b):\n", "n_predict": 8, **GREEDY}
    own, mine = server.post("/completion", native).json(), gateway.post("/completion", native).json()
    told_native = ("content", "tokens_predicted", "tokens_evaluated", "stop_type", "stopping_word", "tokens_cached")
    assert {name: mine.get(name) for name in told_native} == {name: own[name] for name in told_native}, mine
    hello = {"model": model, "content": "Hello, world", "with_pieces": True}
    assert gateway.http.post("/tokenize", json=hello).json() == server.post("/tokenize", hello).json()

    turns = _all_turns_of_the_key(gateway, rig, done=gateway.sent)
    for turn in turns:  # on the board as the API's, with the server's token counts
        row = board_rows.board_row_for(turn.pk)
        assert row is not None and row["via_api"] and row["status"] == "done", row
        assert row["tokens"] == turn.output_tokens > 0 and row["prompt_tokens"] == turn.prompt_tokens > 0, row
        assert (turn.stats or {}).get("backend_timings", {}).get("predicted_n") == turn.output_tokens
    client = Client()
    client.force_login(owner)
    usage = list(csv.DictReader(io.StringIO(client.get("/usage.csv?days=1").getvalue().decode())))
    assert sum(int(row["turns"]) for row in usage) == len(turns)
    assert sum(int(row["prompt_tokens"]) for row in usage) == sum(t.prompt_tokens or 0 for t in turns)
    assert sum(int(row["output_tokens"]) for row in usage) == sum(t.output_tokens or 0 for t in turns)
