"""A decode sweep in real headless Chromium (Debian's package) against the web server, the worker and the embedded
llama-server: started from the form, its progress bar moves as steps end, and its points reach the table and the
chart beside the prediction."""

from __future__ import annotations

import os
import re

import pytest

from tests.test_browser import SHOT_DIR, browser, login, page  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.llama, pytest.mark.django_db(transaction=True)]

SWEEP_X = "() => (document.getElementById('fig-context').data || []).find(t => t.name.startsWith('sweep')).x.length"


@pytest.mark.timeout(300)
def test_a_sweep_started_from_the_form_shows_its_progress_and_points_live(
    page,  # noqa: F811
    web_url,
    celery_worker,
    admin_user,
    rig,
    model_name,
):
    rig.slots = 2
    rig.save(update_fields=["slots"])
    login(page, web_url, "admin")
    page.goto(f"{web_url}/monitoring/sweeps/")
    page.wait_for_function(f"() => document.querySelector('[data-testid=sweep-model]').value === {model_name!r}")
    page.get_by_test_id("sweep-contexts").fill("128")
    page.get_by_test_id("sweep-sessions").fill("0")
    page.get_by_test_id("sweep-start").click()
    error = page.get_by_test_id("sweep-error")
    error.wait_for(state="visible")
    assert "1 to 256" in error.inner_text()  # refused: the message, and no sweep

    page.get_by_test_id("sweep-sessions").fill("1, 2")
    page.get_by_test_id("sweep-max-tokens").fill("24")
    page.get_by_test_id("sweep-start").click()
    page.wait_for_url(re.compile(r".*/monitoring/sweeps/\d+/$"))
    # The rig's own hardware has no measured bandwidth here: the address names a preset, as the page suggests.
    page.goto(page.url + "?model=smollm2-135m&hw=ryzen-7950x")
    page.wait_for_selector("[data-testid=sweep-connection][data-state=live]")
    first = page.evaluate("document.querySelector('[data-testid=sweep-progress]').value")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=sweep-status]').textContent === 'done'", timeout=240_000
    )
    progress = page.get_by_test_id("sweep-progress")
    assert progress.evaluate("el => [el.value, el.max]") == [2, 2]
    assert first < 2  # the bar moved while the page was open: the socket's progress frames
    assert page.locator("[data-testid=sweep-points] tbody tr").count() == 3
    ratio = page.locator("[data-testid=sweep-points] tbody tr td").last.inner_text()
    assert re.fullmatch(r"\d+(\.\d)? %", ratio), ratio  # measured over the step's prediction
    page.wait_for_function(f"() => ({SWEEP_X})() === 3")
    assert page.get_by_test_id("sweep-cancel").is_hidden()
    if SHOT_DIR:
        page.screenshot(path=os.path.join(SHOT_DIR, "sweep.png"), full_page=True)
    assert page.errors == []
