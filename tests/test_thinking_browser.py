"""The chat page's thinking block in real Chromium: live while a reasoning model thinks (a real llama-server whose
template makes SmolLM2 reason, tests/reasoning_llama.py), the per-chat choice sent as the turn's ``think``, and
thoughts rendered as sanitised Markdown like the reply."""

from __future__ import annotations

import re

import pytest

from inference.models import ChatSession, Rig, Turn
from tests.conftest import TEST_QUEUE, wait_until
from tests.reasoning_llama import reasoning_llama_fixture  # noqa: F401  (the ``reasoning_llama_url`` fixture)
from tests.test_browser import XSS_REPLY, browser, login, page  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def thinking_session(owner, model_name, reasoning_llama_url) -> ChatSession:
    rig = Rig.objects.create(name="llama-think", kind=Rig.Kind.LLAMACPP, base_url=reasoning_llama_url, queue=TEST_QUEUE)
    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)


def test_thinking_streams_into_its_block_and_the_choice_is_sent(page, web_url, celery_worker, thinking_session):  # noqa: F811
    login(page, web_url, "owner")
    page.goto(f"{web_url}/sessions/{thinking_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("think").select_option("on")
    page.get_by_test_id("message").fill("Why is the sea salty?")
    page.get_by_test_id("send").click()
    block = page.get_by_test_id("thinking")
    block.wait_for(state="visible")
    assert block.get_attribute("open") is not None  # open while the model thinks
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)

    turn = Turn.objects.get()
    assert turn.params == {"think": True} and turn.thinking_text.strip()
    words = re.findall(r"[A-Za-z]{4,}", turn.thinking_text)
    wait_until(
        lambda: all(word in " ".join(block.inner_text().split()) for word in words),
        timeout_s=5, what="the stored thinking on the page",
    )  # fmt: skip
    assert re.search(r"thought \d+ tok", page.get_by_test_id("stats").inner_text())
    page.reload()  # the choice is kept for this chat
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    assert page.get_by_test_id("think").input_value() == "on"
    assert page.errors == []


def test_thinking_never_runs_as_html_or_script(page, web_url, owner, model_name, thinking_session):  # noqa: F811
    Turn.objects.create(
        session=thinking_session, user_text="hi", reply_text="**fine**", thinking_text=XSS_REPLY,
        status=Turn.Status.DONE, finish_reason="stop", stats={"output_events": 1, "thinking_tokens": 1},
    )  # fmt: skip
    login(page, web_url, "owner")
    page.goto(f"{web_url}/sessions/{thinking_session.pk}/")
    block = page.get_by_test_id("thinking")
    block.wait_for(state="attached")
    page.locator("[data-testid=thinking] > summary").click()
    page.wait_for_selector("[data-testid=thinking] strong")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__xss") is None
    assert block.locator("script, img, svg, [onerror], [onclick], [onload]").count() == 0
    assert "<script>" in block.inner_text()
