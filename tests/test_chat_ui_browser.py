"""The chat UI in real headless Chromium (Debian's package, through Playwright) against the web server, the worker and
llama-server: themes, the 390 px layout, keyboard, highlighted code with copy buttons, settings that reach
llama-server, and rename, delete, search, export and import. Screenshots go to RIGDASH_SCREENSHOT_DIR when set."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.models import ChatSession, Turn
from tests.conftest import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
SHOT_DIR = os.environ.get("RIGDASH_SCREENSHOT_DIR")
AXE = Path(__file__).parent / "vendor" / "axe.min.js"
CODE = 'def greet(name):\n    return f"hello {name}"  # a comment\n'
REPLY = f"Here is some code:\n\n```python\n{CODE}```\n\nAnd **bold** text."
DARK_BG = "rgb(15, 18, 24)"
LIGHT_BG = "rgb(246, 247, 249)"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop in this thread
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        yield browser
        browser.close()
    if previous is None:
        del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def open_page(browser: Any, web_url: str) -> Iterator[Any]:
    """``open_page(username, width=, height=, scheme=)``: a logged-in page in a fresh context."""
    contexts = []

    def make(username: str = "owner", *, width: int = 1200, height: int = 800, scheme: str = "light", **extra: Any):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme, **extra)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.goto(f"{web_url}/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", f"{username}-pw-123")
        page.click("button[type=submit]")
        page.wait_for_url(f"{web_url}/")
        return page

    yield make
    for context in contexts:
        context.close()


def _chat_with_code(owner: Any, rig: Any, model_name: str, title: str = "Code sample") -> ChatSession:
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name, title=title)
    Turn.objects.create(session=session, user_text="Show me a Python function.", reply_text=REPLY, status="done")
    return session


def _body_bg(page: Any) -> str:
    return str(page.evaluate("() => getComputedStyle(document.body).backgroundColor"))


def _overflow(page: Any) -> int:
    return int(page.evaluate("() => document.scrollingElement.scrollWidth"))


def test_theme_follows_the_system_and_the_toggle_is_remembered(open_page, web_url, owner):
    page = open_page(scheme="dark")
    assert _body_bg(page) == DARK_BG  # nothing stored: the system's
    page = open_page(scheme="light")
    assert _body_bg(page) == LIGHT_BG
    toggle = page.get_by_test_id("theme-toggle")
    assert toggle.get_attribute("aria-pressed") == "false"
    toggle.click()
    assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
    assert toggle.get_attribute("aria-pressed") == "true"
    wait_until(lambda: _body_bg(page) == DARK_BG, timeout_s=5, what="the dark background")
    # No flash: the stored theme is set by a blocking script in <head>, before the body is parsed.
    page.add_init_script(
        "new MutationObserver((_, seen) => { if (document.body) {"
        " window.__first = document.documentElement.dataset.theme || 'none'; seen.disconnect(); } })"
        ".observe(document, {childList: true, subtree: true});"
    )
    page.goto(f"{web_url}/usage/")
    assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
    assert page.evaluate("() => window.__first") == "dark"
    assert page.evaluate("() => document.querySelector('head script[src*=\"theme.js\"]').defer") is False
    page.get_by_test_id("theme-toggle").click()
    page.reload()
    assert _body_bg(page) == LIGHT_BG
    assert page.errors == []


def test_every_page_fits_390_px_and_the_menus_fold(open_page, web_url, admin_user, rig, model_name):
    session = _chat_with_code(admin_user, rig, model_name, title="A rather long chat title that must wrap " * 3)
    page = open_page("admin", width=390, height=844)
    pages = ["/", f"/sessions/{session.pk}/", f"/sessions/{session.pk}/delete", "/compare/",
             f"/compare/{session.pk}/{session.pk}/", "/usage/?days=365", "/monitoring/",
             f"/monitoring/rigs/{rig.pk}/", "/board/", "/board/users/", "/board/quotas/", "/board/audit/"]  # fmt: skip
    for path in pages:
        page.goto(f"{web_url}{path}")
        page.wait_for_load_state("load")
        assert _overflow(page) <= 390, f"{path} is {_overflow(page)} px wide at 390"
    page.goto(f"{web_url}/sessions/{session.pk}/")
    nav = page.locator("#site-nav")
    assert not nav.is_visible()
    page.get_by_test_id("menu-toggle").click()
    assert nav.is_visible() and page.get_by_test_id("menu-toggle").get_attribute("aria-expanded") == "true"
    sessions = page.locator(".sidebar .sessions")
    assert not sessions.is_visible()
    page.get_by_test_id("sidebar-toggle").click()
    assert sessions.is_visible()
    page.context.clear_cookies()
    page.goto(f"{web_url}/login/")
    assert _overflow(page) <= 390
    assert page.errors == []


def test_keyboard_slash_focuses_enter_sends_shift_enter_breaks_esc_stops(
    open_page, web_url, chat_session, celery_worker
):
    page = open_page()
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.evaluate("() => document.activeElement.blur()")
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "message"
    page.keyboard.type("Write a very long story about a lighthouse keeper")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("with many chapters.")
    assert page.get_by_test_id("message").input_value().count("\n") == 1
    assert Turn.objects.count() == 0  # Shift+Enter did not send
    page.keyboard.press("Enter")
    page.wait_for_selector(".turn[data-status=decoding]", timeout=60_000)
    page.keyboard.press("Escape")
    page.wait_for_selector(".turn[data-status=cancelled]", timeout=30_000)
    turn = Turn.objects.get()
    assert turn.user_text == "Write a very long story about a lighthouse keeper\nwith many chapters."
    wait_until(lambda: Turn.objects.get().status == "cancelled", timeout_s=10, what="the stored cancel")
    assert page.errors == []


def test_a_code_block_is_highlighted_and_each_copy_button_copies(open_page, web_url, owner, rig, model_name):
    session = _chat_with_code(owner, rig, model_name)
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    page.goto(f"{web_url}/sessions/{session.pk}/")
    pre = page.locator("[data-testid=reply] pre")
    pre.locator(".hljs-keyword").first.wait_for()
    assert pre.locator(".hljs-keyword").first.inner_text() == "def"
    assert pre.locator(".hljs-comment").inner_text() == "# a comment"
    assert page.locator("[data-testid=reply] strong").inner_text() == "bold"
    page.get_by_test_id("copy-code").click()
    page.wait_for_selector("[data-testid=copy-code]:has-text('Copied')")
    assert page.evaluate("() => navigator.clipboard.readText()") == CODE
    page.get_by_test_id("copy-reply").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == REPLY
    page.get_by_test_id("copy-message").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == "Show me a Python function."
    assert page.get_by_test_id("copy-code").get_attribute("aria-label") == "Copy the python code"
    assert page.errors == []


def test_code_still_streaming_is_coloured_once_its_fence_closes(open_page, web_url, owner, rig, model_name):
    """While a fence is open, each frame renders its Markdown alone (the renderer re-renders the tail per frame); the
    block is coloured once closed, and a finished block keeps its colours and its copy button."""
    session = _chat_with_code(owner, rig, model_name)
    page = open_page()
    page.goto(f"{web_url}/sessions/{session.pk}/")
    page.locator("[data-testid=reply] .hljs-keyword").first.wait_for()
    state = page.evaluate(
        r"""async () => {
        const frame = () => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
        const box = document.createElement("div");
        document.body.appendChild(box);
        const r = new RigDashMarkdown.ReplyRenderer(box);
        const seen = (label) => ({label, spans: box.querySelectorAll("pre .hljs-keyword").length,
                                  copies: box.querySelectorAll("button.copy").length});
        let text = "Intro.\n\n```python\n" + "def f(x):\n    return x\n".repeat(200);
        r.set(text); await frame(); const open = seen("open");
        text += "```\n"; r.set(text); await frame(); const closed = seen("closed");
        text += "\nAfter.\n\nMore"; r.set(text); await frame(); const stable = seen("stable");
        return [open, closed, stable];
    }"""
    )
    assert state[0] == {"label": "open", "spans": 0, "copies": 1}
    assert state[1]["spans"] == 400 and state[1]["copies"] == 1  # def and return, 200 times
    assert state[2]["spans"] == 400 and state[2]["copies"] == 1
    assert page.errors == []


def test_settings_saved_in_the_page_reach_llama_server(open_page, web_url, chat_session, celery_worker):
    """The system prompt and max tokens, saved through the form, are what llama-server is asked: its own count of the
    prompt's tokens grows by the system prompt, and the reply stops at the token cap."""
    system = "You are a lighthouse keeper on a remote island. " * 12
    page = open_page()
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("Say hello.")
    page.get_by_test_id("send").click()
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    plain = Turn.objects.get()
    page.locator("[data-testid=settings] summary").click()
    page.get_by_test_id("set-system").fill(system)
    page.get_by_test_id("set-max_tokens").fill("5")
    page.get_by_test_id("set-temperature").fill("0")
    page.get_by_test_id("settings-save").click()
    page.wait_for_selector("[data-testid=messages]:has-text('Settings saved')")
    summary = page.get_by_test_id("settings-summary").inner_text()
    assert summary.startswith(f"system prompt ({len(system)} chars)") and "max tokens 5" in summary
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("Say hello.")
    page.get_by_test_id("send").click()
    wait_until(lambda: Turn.objects.filter(status="done").count() == 2, timeout_s=60, what="the second reply")
    steered = Turn.objects.exclude(pk=plain.pk).get()
    assert steered.params == {"system": system, "max_tokens": 5, "temperature": 0.0}
    assert steered.output_tokens is not None and steered.output_tokens <= 5 and steered.finish_reason == "length"
    assert steered.prompt_tokens is not None and plain.prompt_tokens is not None
    assert steered.prompt_tokens > plain.prompt_tokens + 100, (steered.prompt_tokens, plain.prompt_tokens)
    # A bad value: a clear message, the typed values kept, nothing stored.
    page.locator("[data-testid=settings] summary").click()
    page.get_by_test_id("set-top_p").fill("7")
    page.get_by_test_id("settings-save").click()
    assert "top_p must be between 0 and 1" in page.get_by_test_id("settings-error").inner_text()
    assert page.get_by_test_id("set-top_p").input_value() == "7"
    chat_session.refresh_from_db()
    assert "top_p" not in chat_session.settings
    assert page.errors == []


def test_rename_search_export_import_and_delete(open_page, web_url, owner, rig, model_name, tmp_path):
    session = _chat_with_code(owner, rig, model_name, title="Old name")
    page = open_page()
    page.goto(f"{web_url}/sessions/{session.pk}/")
    page.locator("[data-testid=rename] summary").click()
    page.get_by_test_id("rename-title").fill("Greeting function")
    page.get_by_test_id("rename-save").click()
    page.wait_for_selector("[data-testid=chat-title]:has-text('Greeting function')")
    # Search: a word from the reply finds the chat.
    page.goto(f"{web_url}/")
    page.get_by_test_id("search").fill("bold")
    page.get_by_test_id("search-go").click()
    results = page.get_by_test_id("search-results")
    assert "Greeting function" in results.inner_text() and "**bold**" in results.inner_text()
    # Export as JSON, then import the file: the same conversation, as a new chat.
    page.goto(f"{web_url}/sessions/{session.pk}/")
    with page.expect_download() as download:
        page.get_by_test_id("export-json").click()
    path = tmp_path / "chat.json"
    download.value.save_as(path)
    assert json.loads(path.read_text())["turns"][0]["reply"] == REPLY
    page.goto(f"{web_url}/")
    page.get_by_test_id("import-file").set_input_files(str(path))
    page.get_by_test_id("import-go").click()
    page.wait_for_url(re.compile(r".*/sessions/\d+/$"))
    assert page.url != f"{web_url}/sessions/{session.pk}/"
    page.locator("[data-testid=reply] .hljs-keyword").first.wait_for()
    assert page.get_by_test_id("chat-title").inner_text() == "Greeting function"
    copy = ChatSession.objects.exclude(pk=session.pk).get()
    assert list(copy.turns.values_list("user_text", "reply_text")) == [("Show me a Python function.", REPLY)]
    # A file that is not an export: refused with a reason.
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": "world"}')
    page.goto(f"{web_url}/")
    page.get_by_test_id("import-file").set_input_files(str(bad))
    page.get_by_test_id("import-go").click()
    page.wait_for_selector("[data-testid=messages]:has-text('not a RigDash chat export')")
    # Delete, after a confirmation page.
    page.goto(f"{web_url}/sessions/{copy.pk}/")
    page.get_by_test_id("delete").click()
    page.get_by_test_id("confirm-delete").click()
    page.wait_for_url(f"{web_url}/")
    assert not ChatSession.objects.filter(pk=copy.pk).exists() and ChatSession.objects.filter(pk=session.pk).exists()
    assert page.errors == []


def test_regenerate_shows_two_versions_and_an_edit_makes_a_branch(open_page, web_url, chat_session, celery_worker):
    page = open_page()
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("Name a colour.")
    page.get_by_test_id("send").click()
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    original = Turn.objects.get()
    page.get_by_test_id("regenerate").click()
    page.wait_for_url(re.compile(rf".*/sessions/(?!{chat_session.pk}/)\d+/$"))
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    regenerated = ChatSession.objects.get(branch_of=chat_session)
    assert regenerated.turns.get().user_text == "Name a colour." and regenerated.turns.get().reply_text
    # Each version links to the other.
    chat_session.refresh_from_db()
    assert chat_session.title == "Name a colour."
    assert chat_session.title in page.get_by_test_id("versions").inner_text()
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.get_by_test_id("versions").get_by_role("link").click()
    page.wait_for_url(f"{web_url}/sessions/{regenerated.pk}/")
    assert Turn.objects.get(pk=original.pk).reply_text == original.reply_text  # the original keeps its reply
    # Edit the message and send it as a branch.
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.get_by_test_id("edit").click()
    page.get_by_test_id("edit-text").fill("Name a fruit.")
    page.get_by_test_id("edit-send").click()
    page.wait_for_selector("[data-testid=user-message]:has-text('Name a fruit.')")
    edited = ChatSession.objects.exclude(pk__in=[chat_session.pk, regenerated.pk]).get()
    assert edited.branch_of == chat_session and edited.turns.get().user_text == "Name a fruit."
    assert Turn.objects.get(pk=original.pk).user_text == "Name a colour."
    assert page.errors == []


def test_continue_picks_up_a_reply_cut_by_its_token_cap(open_page, web_url, chat_session, celery_worker):
    """llama-server continues the reply so far (sent as the reply's start) and streams it back first: the new
    version's reply begins with the cut one and goes further."""
    chat_session.settings = {"max_tokens": 8, "temperature": 0.0}
    chat_session.save()
    page = open_page()
    page.goto(f"{web_url}/sessions/{chat_session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("Write a long story about a lighthouse.")
    page.get_by_test_id("send").click()
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    cut = Turn.objects.get()
    assert cut.finish_reason == "length" and cut.reply_text
    page.get_by_test_id("continue").click()
    page.wait_for_url(re.compile(rf".*/sessions/(?!{chat_session.pk}/)\d+/$"))
    page.wait_for_selector(".turn[data-status=done]", timeout=60_000)
    more = ChatSession.objects.get(branch_of=chat_session).turns.get()
    assert more.reply_text.startswith(cut.reply_text) and len(more.reply_text) > len(cut.reply_text)
    assert more.output_tokens is not None and more.output_tokens <= 8  # the cap holds for what it adds
    assert page.errors == []


def test_compare_streams_both_sides_with_their_stats(open_page, web_url, owner, rig, model_name, celery_worker):
    """One llama-server serves one model, so both sides are that model: two chats, two streams at once."""
    page = open_page()
    page.goto(f"{web_url}/compare/")
    page.get_by_test_id("compare-text").fill("Say hello in three words.")
    page.get_by_test_id("compare-go").click()
    page.wait_for_url(re.compile(r".*/compare/\d+/\d+/$"))
    panes = page.get_by_test_id("pane")
    assert panes.count() == 2
    page.evaluate(
        """() => { window.__streaming = new Set();
        document.querySelectorAll('[data-testid=pane]').forEach((pane, i) => new MutationObserver(() => {
          if (pane.querySelector('.turn[data-status=decoding]')) window.__streaming.add(i);
        }).observe(pane, {subtree: true, childList: true, characterData: true, attributes: true})); }"""
    )
    for i in range(2):  # generous: two replies at once on a shared 2-core machine
        panes.nth(i).locator(".turn[data-status=done]").wait_for(timeout=120_000)
        stats = panes.nth(i).get_by_test_id("stats").inner_text()
        assert re.search(r"TTFT \d+ ms .* [\d.]+ tok/s .*prompt \d+ tok", stats), stats
    sessions = list(ChatSession.objects.filter(owner=owner))
    assert len(sessions) == 2 and all(s.turns.get().reply_text for s in sessions)
    # The next message goes to both (short replies: a small model can ramble to its cap on a busy machine).
    ChatSession.objects.filter(owner=owner).update(settings={"max_tokens": 32})
    page.get_by_test_id("message").fill("Now one sentence about snow.")
    page.get_by_test_id("send").click()
    for i in range(2):
        panes.nth(i).locator(".turn[data-status=done] >> nth=1").wait_for(timeout=120_000)
    assert page.evaluate("() => window.__streaming.size") == 2
    assert page.errors == []


def test_pages_have_no_serious_accessibility_findings_in_either_theme(open_page, web_url, admin_user, rig, model_name):
    """axe-core (tests/vendor, injected here only: the page's CSP would refuse it, so this context bypasses CSP)."""
    session = _chat_with_code(admin_user, rig, model_name)
    pages = [f"/sessions/{session.pk}/", "/", "/compare/", f"/compare/{session.pk}/{session.pk}/", "/usage/",
             "/monitoring/", f"/monitoring/rigs/{rig.pk}/", "/board/", f"/sessions/{session.pk}/delete",
             "/board/users/", "/board/quotas/", "/board/audit/", f"/rigs/{rig.pk}/models/"]  # fmt: skip
    for scheme in ("light", "dark"):
        page = open_page("admin", scheme=scheme, bypass_csp=True)
        for path in pages:
            page.goto(f"{web_url}{path}")
            page.wait_for_load_state("load")
            if path.startswith("/sessions/") and path.endswith("/"):
                page.locator("[data-testid=reply] .hljs-keyword").first.wait_for()
            assert _axe_serious(page) == [], f"{scheme} {path}"
        page.context.clear_cookies()
        page.goto(f"{web_url}/login/")
        assert _axe_serious(page) == [], f"{scheme} /login/"


def _axe_serious(page: Any) -> list[str]:
    page.add_script_tag(path=str(AXE))
    return list(
        page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
            ".map(v => `${v.id}: ${v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', ')}`)"
        )
    )


@pytest.mark.skipif(not SHOT_DIR, reason="set RIGDASH_SCREENSHOT_DIR to take the screenshots")
def test_screenshots_of_the_chat_in_both_themes_and_sizes(open_page, web_url, owner, rig, model_name, celery_worker):
    """A real reply from llama-server (its stats line is real) under a stored one with code."""
    session = _chat_with_code(owner, rig, model_name, title="Python greeting")
    session.settings = {"system": "You are a concise programming assistant.", "temperature": 0.2, "seed": 42}
    session.save()
    page = open_page()
    page.goto(f"{web_url}/sessions/{session.pk}/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    page.get_by_test_id("message").fill("Write a Python function that adds two numbers, in a code block.")
    page.get_by_test_id("send").click()
    page.wait_for_selector(".turn[data-status=done] >> nth=1", timeout=60_000)
    for scheme in ("light", "dark"):
        for width, height in ((1400, 900), (390, 844)):
            page = open_page(width=width, height=height, scheme=scheme)
            page.goto(f"{web_url}/sessions/{session.pk}/")
            page.locator("[data-testid=reply] .hljs-keyword").first.wait_for()
            page.wait_for_timeout(300)
            page.screenshot(path=os.path.join(SHOT_DIR, f"chat-{scheme}-{width}.png"))
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=os.path.join(SHOT_DIR, f"chat-{scheme}-{width}-top.png"))


@pytest.mark.skipif(not SHOT_DIR, reason="set RIGDASH_SCREENSHOT_DIR to take the screenshots")
def test_screenshots_of_the_other_pages(open_page, web_url, admin_user, rig, model_name):
    """Usage at 30 and 365 days (a year of turns), the rigs, a rig's dashboard, the board and the chat list."""
    from datetime import timedelta

    from django.utils import timezone

    session = _chat_with_code(admin_user, rig, model_name)
    now = timezone.now()
    for day in range(0, 365, 3):
        turn = Turn.objects.create(session=session, user_text="u", reply_text="r", status="done",
                                   prompt_tokens=20 + day % 50, output_tokens=100 + (day * 7) % 300)  # fmt: skip
        at = now - timedelta(days=day)
        Turn.objects.filter(pk=turn.pk).update(created_at=at, started_at=at, finished_at=at + timedelta(seconds=2))
    pages = {"usage-30": "/usage/?days=30", "usage-365": "/usage/?days=365", "rigs": "/monitoring/",
             "rig": f"/monitoring/rigs/{rig.pk}/", "board": "/board/", "list": "/",
             "compare": f"/compare/{session.pk}/{session.pk}/"}  # fmt: skip
    for scheme, width, height in (("dark", 390, 844), ("light", 1400, 900)):
        page = open_page("admin", width=width, height=height, scheme=scheme)
        for name, path in pages.items():
            page.goto(f"{web_url}{path}")
            page.wait_for_load_state("load")
            page.wait_for_timeout(800)  # the charts draw after load
            page.screenshot(path=os.path.join(SHOT_DIR, f"{name}-{scheme}-{width}.png"))


def test_the_no_worker_banner_follows_a_waiting_turn_while_the_page_is_open(open_page, web_url, owner):
    """The banner was the page load's: now the waiting turn's reason, told by the periodic dispatch, shows and hides
    it (and the turn's line says why it waits). The workers' answers are recorded by hand here, as the sampler's
    probe records them (tests/test_rig_queues.py runs the probe against a real worker)."""
    from django.utils import timezone

    from inference.live import consumers
    from inference.models import Rig
    from inference.queue import dispatch

    orphan = Rig.objects.create(name="orphan-ui", kind=Rig.Kind.OLLAMA, base_url="http://ollama:11434")
    session = ChatSession.objects.create(owner=owner, rig=orphan, model_name="m", title="Waiting")
    Turn.objects.create(session=session, user_text="hello", dispatched_at=timezone.now())  # handed to its queue
    consumers.record([])  # no worker on rig.orphan-ui
    try:
        page = open_page()
        page.goto(f"{web_url}/sessions/{session.pk}/")
        banner = page.locator('[data-testid="no-consumer"]')
        stats = page.locator('[data-testid="stats"]')
        banner.wait_for(state="visible")
        page.wait_for_function("() => document.querySelector('[data-testid=stats]')?.textContent.includes('no worker')")
        dispatch.dispatch_all()  # the periodic pass (every 5 s) tells it too, while it lasts
        consumers.record([orphan.queue])  # a worker for it started
        dispatch.dispatch_all()
        banner.wait_for(state="hidden")
        wait_until(lambda: "no worker" not in stats.text_content(), timeout_s=10, what="the reason gone")
        consumers.record([])  # and it stopped again
        dispatch.dispatch_all()
        banner.wait_for(state="visible")
        assert consumers.NO_WORKER in stats.text_content()
        assert page.errors == []
    finally:
        consumers.swap_told(orphan.pk, "")
