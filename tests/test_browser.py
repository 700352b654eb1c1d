"""Real headless Chromium (Debian's package) driven by Playwright against the web server (uvicorn), the worker and
llama-server."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from inference.models import Turn
from inference.turns import lifecycle, submit
from rigdash.launcher import free_port, wait_http, web_command
from tests.conftest import LOG_DIR, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
SHOT_DIR = os.environ.get("RIGDASH_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    # Playwright's sync API runs an event loop in this thread; the ORM calls in these tests are safe.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        yield browser
        browser.close()
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    yield page
    context.close()


def login(page: Any, web_url: str, username: str) -> None:
    page.goto(f"{web_url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"{username}-pw-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{web_url}/")


def test_chat_in_browser_streams_tokens_and_fills_stats(page, web_url, celery_worker, owner, rig, model_name):
    login(page, web_url, "owner")
    picker = page.get_by_test_id("model-picker")
    assert model_name in picker.inner_text()
    page.get_by_test_id("new-chat").click()
    page.wait_for_url(re.compile(r".*/sessions/\d+/$"))
    page.wait_for_selector("[data-testid=connection][data-state=live]")

    # Record every change of the reply's text as it happens, to see tokens arrive one batch at a time.
    page.evaluate(
        """() => {
        window.__replySizes = [];
        new MutationObserver(() => {
          const r = document.querySelector('[data-testid=reply]');
          if (r) window.__replySizes.push(r.textContent.length);
        }).observe(document.querySelector('[data-testid=turns]'),
                   {subtree: true, childList: true, characterData: true});
    }"""
    )
    page.get_by_test_id("message").fill("Write a short poem about the sea.")
    page.get_by_test_id("send").click()
    page.wait_for_selector("[data-testid=stats]:has-text('tok/s')")
    stats_live = page.get_by_test_id("stats").inner_text()
    gauge = page.get_by_test_id("context-gauge")
    gauge.wait_for(state="visible")
    assert (
        0 < float(gauge.get_attribute("value") or page.evaluate("() => document.querySelector('.ctx-gauge').value")) < 1
    )
    assert re.search(r"context \d+ / 2048", page.get_by_test_id("stats").inner_text())
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    if SHOT_DIR:
        page.screenshot(path=os.path.join(SHOT_DIR, "chat.png"), full_page=True)

    turn = Turn.objects.get()
    reply_el = page.get_by_test_id("reply")
    sizes = page.evaluate("window.__replySizes")
    assert len(set(sizes)) > 2, f"the reply appeared all at once, not streamed: {sizes}"
    assert "TTFT" in stats_live
    final_stats = page.get_by_test_id("stats").inner_text()
    assert re.search(r"TTFT \d+ ms", final_stats) and re.search(r"\d+ tokens", final_stats)
    assert re.search(r"[\d.]+ tok/s", final_stats)
    # What the page shows is the stored reply, rendered (compare words, Markdown changes spacing); the
    # last render happens on the next animation frame after the end.
    stored_words = re.findall(r"[A-Za-z]{4,}", turn.reply_text)
    assert stored_words
    wait_until(
        lambda: all(word in " ".join(reply_el.inner_text().split()) for word in stored_words),
        timeout_s=5, what="the whole stored reply on the page",
    )  # fmt: skip
    assert page.get_by_test_id("user-message").inner_text() == "Write a short poem about the sea."
    assert page.errors == []


def test_empty_and_oversized_messages_get_a_clear_error_and_keep_the_text(page, web_url, celery_worker, chat_session):
    from django.conf import settings

    login(page, web_url, "owner")
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("send").click()
    assert "empty" in page.get_by_test_id("error").inner_text()
    too_long = "x" * (settings.RIGDASH.max_message_chars + 1)
    page.get_by_test_id("message").fill(too_long)
    page.get_by_test_id("send").click()
    page.wait_for_selector("[data-testid=error]:has-text('limit')")
    assert page.get_by_test_id("message").input_value() == too_long  # nothing typed is lost
    assert Turn.objects.count() == 0


def test_a_message_sent_while_the_task_queue_is_down_is_kept_and_the_page_says_so(
    page, stack, service_env, chat_session
):
    """A web server whose Celery broker cannot be reached (a port nothing listens on; the channel layer's Redis is
    up): the message is stored, the page shows it waiting with an error that says it is saved, and the box is
    cleared so that it is not sent twice."""
    port = free_port()
    env = {**service_env, "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    proc = stack.start(
        "web-no-broker", web_command(host="127.0.0.1", port=port), env=env, log_path=LOG_DIR / "web-nb.log"
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/static/rigdash/app.css", timeout_s=60, proc=proc)
    login(page, url, "owner")
    page.goto(f"{url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("keep me")
    page.get_by_test_id("send").click()
    page.wait_for_selector("[data-testid=error]:has-text('saved')")
    page.wait_for_selector(".turn[data-status=queued] [data-testid=user-message]:has-text('keep me')")
    assert page.get_by_test_id("message").input_value() == ""
    assert page.get_by_test_id("stop").is_visible()  # a waiting turn can be stopped, as any other
    turn = Turn.objects.get(session=chat_session)
    assert (turn.user_text, turn.status, turn.dispatched_at) == ("keep me", Turn.Status.QUEUED, None)
    assert page.errors == []


XSS_REPLY = """Here you go:

<img src=x onerror="window.__xss='img'"><script>window.__xss='script'</script>
<svg onload="window.__xss='svg'"></svg>

[click me](javascript:window.__xss='link') and [data](data:text/html,<script>alert(1)</script>)

<a href="#" onclick="window.__xss='onclick'">raw anchor</a> **bold** `code`
"""


def test_model_output_never_runs_as_html_or_script(page, web_url, chat_session):
    Turn.objects.create(
        session=chat_session, user_text="<b>hi</b>", reply_text=XSS_REPLY, status=Turn.Status.DONE,
        finish_reason="stop", stats={"output_events": 1},
    )  # fmt: skip
    login(page, web_url, "owner")
    response = page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("[data-testid=reply] strong")
    page.wait_for_timeout(300)
    assert page.evaluate("window.__xss") is None
    reply = page.get_by_test_id("reply")
    assert reply.locator("script, img, svg, [onerror], [onclick], [onload]").count() == 0
    hrefs = reply.locator("a").evaluate_all("els => els.map(a => a.getAttribute('href'))")
    assert not any(h and re.match(r"\s*(javascript|data):", h, re.I) for h in hrefs), hrefs
    assert "<script>" in reply.inner_text()  # raw HTML is shown as text, not parsed
    assert page.get_by_test_id("user-message").inner_text() == "<b>hi</b>"


def test_the_overview_rows_follow_each_rigs_live_samples(page, web_url, sampler_process, rig, owner):
    """The overview's sockets get a slim frame of each sample (monitoring/consumers.py, overview_frame): the row's
    state, slots and KV still fill from it, for a user who is not staff."""
    login(page, web_url, "owner")
    page.goto(f"{web_url}/monitoring/")
    row = page.locator(f"tr[data-rig='{rig.pk}']")
    row.locator(".slots").filter(has_text=re.compile(r"^\d+/\d+$")).wait_for(timeout=30_000)
    assert row.locator(".state").inner_text().startswith("up")
    assert row.locator(".kv").inner_text().endswith("MiB")
    assert page.errors == []


def test_rig_dashboard_fills_its_panels_during_a_chat_turn(
    page, web_url, celery_worker, sampler_process, chat_session, admin_user
):
    from monitoring.models import RigSample

    off_loop = ThreadPoolExecutor(max_workers=1)  # services publish events: not from Playwright's loop thread
    off_loop.submit(
        submit.turn_submit, session=chat_session, text="Tell me a long story about a dragon.",
        params={"max_tokens": 700, "temperature": 0.9, "seed": 5},
    ).result()  # fmt: skip
    login(page, web_url, "admin")
    page.goto(f"{web_url}/monitoring/rigs/{chat_session.rig_id}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.wait_for_selector("[data-testid=slots] td:has-text('decoding')", timeout=30_000)
    page.wait_for_selector("[data-testid=active-turns] td:has-text('owner')")
    wait_until(
        lambda: page.evaluate("() => (document.getElementById('fig-decode').data || [{x: []}])[0].x.length") >= 2,
        timeout_s=20, interval_s=0.25, what="points on the decode panel",
    )  # fmt: skip
    assert "bytes per token" in page.get_by_test_id("kv-facts").inner_text()
    assert "23040 bytes per token" in page.get_by_test_id("kv-facts").inner_text()
    assert "system RAM" in page.get_by_test_id("placement").inner_text()
    assert page.get_by_test_id("backend-state").get_attribute("data-state") == "up"
    assert "tokens/s" in page.get_by_test_id("roofline").inner_text()
    gpu_text = page.get_by_test_id("gpu").inner_text()
    assert gpu_text.startswith("GPU")
    if SHOT_DIR:
        page.screenshot(path=os.path.join(SHOT_DIR, "dashboard.png"), full_page=True)
    for turn in Turn.objects.filter(status__in=Turn.ACTIVE):
        off_loop.submit(lifecycle.turn_cancel, turn=turn).result()
    assert RigSample.objects.filter(rig_id=chat_session.rig_id).count() >= 2
    assert page.errors == []
