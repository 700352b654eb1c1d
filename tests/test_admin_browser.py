"""The admin board in real Chromium, next to a user's chat page (two browser contexts), on the real stack."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from inference.models import AuditLog, Rig, Turn
from inference.turns import submit
from tests.adminkit import make_session, quiet
from tests.conftest import wait_until
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.test_browser import CHROMIUM, SHOT_DIR, login

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop in this thread
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        yield browser
        browser.close()
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


def _page(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1300, "height": 800}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.errors = []
    page.console_errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.on("console", lambda msg: msg.type == "error" and page.console_errors.append(f"{msg.text} at {msg.location}"))
    page.on("response", lambda r: r.status >= 400 and "favicon" not in r.url and page.console_errors.append(r.url))
    return page


def _in_thread(func: Any, **kwargs: Any) -> Any:
    """Call ``func`` off this thread: Playwright's loop runs here, and services use async_to_sync."""

    def call() -> Any:
        try:
            return func(**kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def _tokens(row: Any) -> int:
    text = row.locator("[data-testid=tokens]").inner_text()
    return int(text) if text.isdigit() else 0


def test_board_shows_live_turns_and_cancelling_there_ends_the_turn_in_the_users_page(
    chromium, web_url, celery_worker, owner, other_user, admin_user, rig, model_name, chat_session
):
    rig.slots = 1  # one slot: the owner's turn waits behind the other user's
    rig.save()
    story = "Write a long story about a lighthouse keeper and a storm, with many details."
    theirs = _in_thread(
        submit.turn_submit,
        session=make_session(other_user, rig, model_name),
        text=story,
        params={"temperature": 0.7, "seed": 9},
    )
    wait_until(lambda: Turn.objects.get(pk=theirs.pk).status == "decoding", timeout_s=60, what="their turn to run")

    board = _page(chromium)
    login(board, web_url, "admin")
    board.goto(f"{web_url}/board/")
    board.wait_for_selector("[data-testid=board-connection][data-state=live]")
    chat = _page(chromium)
    login(chat, web_url, "owner")
    chat.goto(f"{web_url}/sessions/{chat_session.pk}/")
    chat.wait_for_selector("[data-testid=connection][data-state=live]")
    chat.get_by_test_id("message").fill(story)
    chat.get_by_test_id("send").click()

    # The owner's page says where their turn waits; the board shows both users' turns.
    chat.wait_for_selector("[data-testid=stats]:has-text('position 1 in the queue (0 turns wait ahead of yours)')")
    their_row = board.locator("tr[data-user=other][data-status=decoding]")
    my_row = board.locator("tr[data-user=owner]")
    board.wait_for_selector("tr[data-user=owner][data-status=queued] >> text=queued #1")
    first = _tokens(their_row)
    board.wait_for_function(
        f"() => Number(document.querySelector('tr[data-user=other] [data-testid=tokens]').textContent) > {first}"
    )
    assert re.search(r"\d+ / \d+", their_row.locator("[data-testid=context]").inner_text())

    # Cancel theirs: the slot frees and the owner's turn starts, live on the board.
    their_row.get_by_test_id("cancel").click()
    board.wait_for_selector("tr[data-user=other][data-status=cancelled]")
    board.wait_for_selector("tr[data-user=owner][data-status=decoding]", timeout=60_000)
    chat.wait_for_selector(".turn[data-status=decoding]")
    board.wait_for_function(
        "() => Number(document.querySelector('tr[data-user=owner] [data-testid=tokens]').textContent) > 3"
    )
    if SHOT_DIR:
        board.screenshot(path=os.path.join(SHOT_DIR, "board.png"), full_page=True)

    # Cancel the owner's running turn from the board: it ends in the owner's page with the partial reply.
    my_row.get_by_test_id("cancel").click()
    chat.wait_for_selector(".turn[data-status=cancelled]", timeout=5_000)
    assert "cancelled" in chat.get_by_test_id("stats").inner_text()
    mine = Turn.objects.get(session=chat_session)
    assert (mine.status, mine.finish_reason) == ("cancelled", "cancelled") and mine.reply_text
    shown = " ".join(chat.get_by_test_id("reply").inner_text().split())
    assert all(word in shown for word in re.findall(r"[A-Za-z]{4,}", mine.reply_text)[:10])
    board.wait_for_selector("tr[data-user=owner][data-status=cancelled]")
    assert my_row.get_by_test_id("cancel").is_hidden()
    assert Turn.objects.get(pk=theirs.pk).status == "cancelled"
    assert sorted(AuditLog.objects.values_list("target", flat=True)) == sorted([f"turn:{theirs.pk}", f"turn:{mine.pk}"])
    assert board.errors == [] and chat.errors == []
    for errors in (board.console_errors, chat.console_errors):
        assert [e for e in errors if "Failed to load resource" not in e] == []  # 4xx/5xx URLs are listed too


def test_usage_page_draws_plotly_charts_under_the_csp(chromium, web_url, owner, rig, model_name):
    from django.utils import timezone

    now = timezone.now()
    Turn.objects.create(
        session=make_session(owner, rig, model_name), user_text="q", status=Turn.Status.DONE, started_at=now,
        finished_at=now, prompt_tokens=5, output_tokens=17,
    )  # fmt: skip
    page = _page(chromium)
    login(page, web_url, "owner")
    response = page.goto(f"{web_url}/usage/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.wait_for_selector("[data-testid=usage-charts] .main-svg")
    assert page.locator("[data-testid=usage-charts] .js-plotly-plot").count() == 3
    assert "17 reply tokens" in page.get_by_test_id("usage-totals").inner_text()
    if SHOT_DIR:
        page.screenshot(path=os.path.join(SHOT_DIR, "usage.png"), full_page=True)
    # A chart's "Download plot as a PNG" (Plotly draws it through a blob: image, which the CSP admits).
    chart = page.locator("[data-testid=usage-charts] .js-plotly-plot").first
    chart.hover()
    with page.expect_download(timeout=15_000) as download:
        chart.locator(".modebar-btn[data-title='Download plot as a PNG']").click()
    with open(download.value.path(), "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    assert page.errors == []
    refused = [e for e in page.console_errors if "Failed to load resource" not in e]
    assert refused == [], refused


def test_an_ollama_history_cut_reads_on_the_chat_and_the_board(chromium, web_url, owner, admin_user, ollama):
    rig = quiet(Rig.objects.create(name="ollama-ui", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue="q4"))
    session = make_session(owner, rig, "smollm2:135m")
    now = timezone.now()
    cut = {"sent_estimate": 612, "read": 22, "window": 256, "<img src=x onerror=alert(1)>": 1}
    Turn.objects.create(session=session, user_text="And then?", reply_text="the keeper", status=Turn.Status.DONE,
                        started_at=now, finished_at=now, output_tokens=2, prompt_tokens=22,
                        stats={"history_truncated": cut, "context_limit": 256})  # fmt: skip
    chat = _page(chromium)
    login(chat, web_url, "owner")
    chat.goto(f"{web_url}/sessions/{session.pk}/")
    stats = chat.locator("[data-testid=stats]").last
    stats.wait_for()
    assert "⚠ history cut: the model read 22 of about 612 prompt tokens" in stats.inner_text()
    board = _page(chromium)
    login(board, web_url, "admin")
    board.goto(f"{web_url}/board/")
    warn = board.locator("[data-testid=history-cut]").first
    warn.wait_for()
    assert "history cut" in warn.inner_text() and "older messages were dropped" in warn.get_attribute("title")
    assert not chat.errors and not board.errors and not chat.console_errors and not board.console_errors


def test_the_board_says_why_a_queued_turn_waits(chromium, web_url, owner, admin_user):
    """A rig behind an agent that never reported holds its turns in RigDash's queue: the board row says so, as the
    chat page does (the reason's text is the dispatch's: inference/queue/dispatch.py)."""
    rig = Rig.objects.create(name="remote", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.remote",
                             agent_key="agent-key-that-never-reported-" + "k" * 20)  # fmt: skip
    quiet(rig)
    turn = _in_thread(submit.turn_submit, session=make_session(owner, rig, "smol"), text="hello")
    board = _page(chromium)
    login(board, web_url, "admin")
    board.goto(f"{web_url}/board/")
    row = board.locator(f"tr[data-turn='{turn.pk}'][data-status=queued]")
    row.locator("text=waiting: the rig's agent down: it has never reported").wait_for()
    assert "queued #1 (0 ahead)" in row.inner_text()
    assert Turn.objects.get(pk=turn.pk).dispatched_at is None
    assert board.errors == [] and [e for e in board.console_errors if "Failed to load resource" not in e] == []
