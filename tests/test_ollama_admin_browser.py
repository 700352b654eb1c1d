"""The model-management page in real headless Chromium: pull with a moving progress bar, delete, errors.

No Ollama binary can run here: the rig points at tests/ollama_replay.py, a protocol replay of Ollama's API;
Daphne, the Celery worker, Redis, PostgreSQL and Chromium are real.
"""

from __future__ import annotations

import os

import pytest

from inference.models import Rig
from tests.conftest import TEST_QUEUE
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.test_browser import SHOT_DIR, browser, login, page  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]


def test_admin_pulls_and_deletes_a_model_in_the_browser(page, web_url, celery_worker, admin_user, ollama):  # noqa: F811
    ollama.pull_step_s = 0.1
    rig = Rig.objects.create(name="ollama-ui", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)
    login(page, web_url, "admin")
    page.get_by_test_id("manage-models").click()
    page.wait_for_url(f"{web_url}/rigs/{rig.pk}/models/")
    page.wait_for_selector("[data-testid=connection][data-state=live]")
    assert "smollm2:135m" in page.get_by_test_id("installed").inner_text()
    page.evaluate(
        """() => {
        window.__pullTexts = [];
        new MutationObserver(() => {
          for (const s of document.querySelectorAll('.pull-status')) window.__pullTexts.push(s.textContent);
        }).observe(document.querySelector('[data-testid=pulls]'),
                   {subtree: true, childList: true, characterData: true});
    }"""
    )

    page.get_by_test_id("pull-name").fill("tinyllama")
    page.get_by_test_id("pull").click()
    page.wait_for_selector(".pulls li[data-state=done]", timeout=30_000)
    page.wait_for_selector("[data-testid=installed] tr[data-model='tinyllama:latest']")
    texts = page.evaluate("window.__pullTexts")
    percents = [int(t.split("%")[0].rsplit(" ", 1)[-1]) for t in texts if "%" in t]
    assert any(0 < p < 100 for p in percents), f"the bar never showed partial progress: {texts}"
    assert page.locator(".pulls progress").evaluate("bar => bar.value === bar.max")
    if SHOT_DIR:
        page.screenshot(path=os.path.join(SHOT_DIR, "models.png"), full_page=True)

    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("button[data-action=delete][data-model='tinyllama:latest']").click()
    page.wait_for_selector("[data-testid=installed] tr[data-model='tinyllama:latest']", state="detached")
    assert "tinyllama:latest" not in ollama.models

    page.get_by_test_id("pull-name").fill("no-such-model")
    page.get_by_test_id("pull").click()
    page.wait_for_selector(".pulls li[data-state=failed]")
    assert "file does not exist" in page.get_by_test_id("error").inner_text()
    page.get_by_test_id("pull-name").fill("bad name!")
    page.get_by_test_id("pull").click()
    page.wait_for_selector("[data-testid=error]:has-text('model name')")
    assert page.errors == []


def test_ordinary_user_gets_the_404_page(page, web_url, other_user, ollama):  # noqa: F811
    rig = Rig.objects.create(name="ollama-ui", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue="rig.ui-404")
    login(page, web_url, "other")
    response = page.goto(f"{web_url}/rigs/{rig.pk}/models/")
    assert response.status == 404
    assert page.get_by_test_id("manage-models").count() == 0
