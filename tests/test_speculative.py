"""Speculative decoding on a real llama-server with SmolLM2 as its own draft model (``-md`` the same GGUF,
``--spec-type draft-simple``): the plug-in reads the reply's draft counts, a turn through RigDash keeps them,
and the rig's dashboard, sampler and /metrics show the acceptance."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from inference.backends.base import ChatRequest
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.llamacpp.chat import draft_counts
from inference.models import ChatSession, Rig, Turn
from inference.turns import submit
from monitoring import prometheus, selectors, turn_metrics
from monitoring.sampling import RigSampler
from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests.conftest import LOG_DIR, TEST_QUEUE, page_json, wait_until
from tests.test_browser import browser, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.llama
T = TypeVar("T")
PROMPT = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]


@pytest.fixture(scope="module")
def draft_url(stack: Stack) -> Iterator[str]:
    """A second llama-server drafting with the model it serves (one slot)."""
    processes, port = Stack(), free_port()
    model = os.environ["LLAMA_MODEL_PATH"]
    extra = ["-md", model, "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    proc = processes.start("llama-server-draft", llama_server_command(port=port, slots=1, ctx=2048, extra=extra),
                           log_path=LOG_DIR / "llama-server-draft.log")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, proc=proc)
    yield url
    processes.stop()


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """On a thread of its own: the browser test's module-wide Playwright runs an event loop in this one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def test_timings_draft_counts_are_validated():
    assert draft_counts({"draft_n": 12, "draft_n_accepted": 9}) == (12, 9)
    assert draft_counts({"predicted_n": 3}) == (None, None)  # llama-server sends none without a draft
    for bad in ({"draft_n": 3, "draft_n_accepted": 4}, {"draft_n": "3", "draft_n_accepted": 1},
                {"draft_n": True, "draft_n_accepted": 0}, {"draft_n": 3, "draft_n_accepted": -1}):  # fmt: skip
        assert draft_counts(bad) == (None, None), bad


def test_the_plugin_reads_each_replys_draft_counts(draft_url, llama_url):
    async def last_stats(url: str):
        request = ChatRequest(model="m", messages=PROMPT, max_tokens=24, temperature=0)
        chunks = [chunk async for chunk in LlamaCppBackend(url).stream_chat(request)]
        return next(chunk.stats for chunk in reversed(chunks) if chunk.stats is not None)

    stats = run_async(lambda: last_stats(draft_url))
    assert stats.draft_tokens and stats.draft_tokens > 0
    assert stats.draft_accepted_tokens is not None and 0 <= stats.draft_accepted_tokens <= stats.draft_tokens
    assert (stats.draft_tokens, stats.draft_accepted_tokens) == (stats.raw["draft_n"], stats.raw["draft_n_accepted"])
    assert stats.draft_acceptance == stats.draft_accepted_tokens / stats.draft_tokens
    plain = run_async(lambda: last_stats(llama_url))  # the suite's server has no draft model
    assert plain.draft_tokens is None and plain.draft_acceptance is None


@pytest.mark.django_db(transaction=True)
def test_a_turn_keeps_its_acceptance_and_the_rig_shows_it(draft_url, celery_worker, owner, admin_user, monkeypatch):
    monkeypatch.setattr(prometheus, "turn_totals", turn_metrics.TurnTotals())
    rig = Rig.objects.create(name="drafting", kind=Rig.Kind.LLAMACPP, base_url=draft_url, queue=TEST_QUEUE, slots=1)
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="SmolLM2")
    turn = submit.turn_submit(session=session, text=PROMPT[0]["content"], params={"temperature": 0, "max_tokens": 24})
    wait_until(lambda: Turn.objects.get(pk=turn.pk).finished_at, timeout_s=120, what="the drafted turn to end")
    turn.refresh_from_db()
    assert turn.status == Turn.Status.DONE, turn.error
    drafts = turn_metrics.draft_counts(turn.stats)
    assert drafts is not None and drafts[0] > 0 and 0 <= drafts[1] <= drafts[0]

    speculative = selectors.rig_latency(rig)["speculative"]
    assert (speculative["drafted"], speculative["accepted"], speculative["drafted_turns"]) == (*drafts, 1)
    sample = run_async(RigSampler(rig=rig, bandwidth_gbs=25.0).take)
    assert sample.series["llamacpp_spec_decode_num_draft_tokens_total"] >= drafts[0]  # llama-server's own counter
    assert 0 <= sample.series["spec_acceptance"] <= 1

    client = Client()
    client.force_login(admin_user)
    html = client.get(f"/monitoring/rigs/{rig.pk}/").content.decode()
    assert page_json(html)["speculative"]["drafted"] == drafts[0] and 'data-testid="speculative"' in html
    from monitoring.services import sample_store

    sample_store(rig_id=rig.pk, sample=sample)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    drafted = [s.value for s in families["rigdash_draft_tokens"].samples if s.labels["rig"] == "drafting"]
    accepted = [s.value for s in families["rigdash_draft_accepted_tokens"].samples if s.labels["rig"] == "drafting"]
    assert (drafted, accepted) == ([drafts[0]], [drafts[1]])
    ratio = families["rigdash_backend_draft_acceptance_ratio"].samples
    assert [s.value for s in ratio if s.labels["rig"] == "drafting"] == [sample.series["spec_acceptance"]]


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_chat_and_the_dashboard_show_acceptance_in_a_browser(draft_url, web_url, page, owner):  # noqa: F811
    """A reply drafted by the real server, stored as the worker stores it; both pages in Chromium."""
    from monitoring.services import sample_store
    from tests.test_browser import login

    async def drafted():
        request = ChatRequest(model="m", messages=PROMPT, max_tokens=24, temperature=0)
        chunks = [chunk async for chunk in LlamaCppBackend(draft_url).stream_chat(request)]
        return "".join(c.text for c in chunks), next(c.stats for c in reversed(chunks) if c.stats)

    text, stats = run_async(drafted)
    rig = Rig.objects.create(name="drafting", kind=Rig.Kind.LLAMACPP, base_url=draft_url, queue="rig.drafting")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="SmolLM2")
    Turn.objects.create(session=session, user_text=PROMPT[0]["content"], reply_text=text, status="done",
                        finish_reason="length", stats={"ttft_ms": 30.0, "backend_timings": stats.raw},
                        finished_at=timezone.now())  # fmt: skip
    sample = run_async(RigSampler(rig=rig, bandwidth_gbs=25.0).take)
    sample_store(rig_id=rig.pk, sample=sample)
    drafted_n, accepted_n = stats.draft_tokens, stats.draft_accepted_tokens
    login(page, web_url, "owner")
    page.goto(f"{web_url}/sessions/{session.pk}/")
    expected = f"accepted ({accepted_n} / {drafted_n})"
    page.wait_for_selector(f"[data-testid=stats]:has-text('{expected}')")
    page.goto(f"{web_url}/monitoring/rigs/{rig.pk}/")
    line = page.get_by_test_id("speculative")
    line.wait_for(state="visible")
    assert f"({accepted_n} of {drafted_n}) in 1 of the last 1 turns" in line.inner_text()
    signals = page.get_by_test_id("signals").inner_text()
    assert "speculative acceptance (llama-server, since it started)" in signals and "drafted tokens" in signals
    assert page.errors == []
