"""The calculator in real headless Chromium (Debian's package) against the web server: inputs change the charts, a
preset fills its fields, bad input is shown beside its field, and a copied URL restores every input and the result."""

from __future__ import annotations

import os

import pytest

from tests.test_browser import SHOT_DIR, browser, login, page  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CURVE = "() => Array.from(document.getElementById('fig-context').data[0].y)"


def _field(tab, name):
    return tab.locator(f"[data-testid=calc-form] [name={name}]")


def _wait_computed(tab, previous):
    tab.wait_for_function(
        "prev => document.querySelector('[data-testid=calc-form]').dataset.computed !== prev", arg=previous
    )
    return tab.evaluate("document.querySelector('[data-testid=calc-form]').dataset.computed")


def test_inputs_redraw_the_charts_and_a_shared_url_restores_them(page, web_url, owner):  # noqa: F811
    login(page, web_url, "owner")
    page.goto(f"{web_url}/monitoring/calculator/")
    page.wait_for_function("() => document.getElementById('fig-context').data")
    before = page.evaluate(CURVE)
    session_rate = page.get_by_test_id("out-tps-session").inner_text()
    assert float(session_rate.replace(",", "")) > 0

    computed = page.evaluate("document.querySelector('[data-testid=calc-form]').dataset.computed")
    assert computed == "0"
    _field(page, "context").fill("32768")
    computed = _wait_computed(page, computed)
    page.wait_for_url("**context=32768**")
    after_context = page.evaluate(CURVE)
    assert after_context != before  # the ladder follows the context
    assert page.get_by_test_id("out-tps-session").inner_text() != session_rate

    _field(page, "hw").select_option("h200")
    computed = _wait_computed(page, computed)
    assert _field(page, "vram_gbs").input_value() == "4800"  # the preset filled its fields
    assert _field(page, "host").input_value() == "ddr5-8ch"
    assert "H200 datasheet" in page.get_by_test_id("preset-sources").inner_text()
    after_h200 = page.evaluate(CURVE)
    assert after_h200[0] > after_context[0] * 4  # 4.8 TB/s against 1,008 GB/s
    page.wait_for_url("**hw=h200**")
    shared = page.url
    result = page.get_by_test_id("outputs").inner_text()
    assert page.get_by_test_id("share-link").get_attribute("href") in shared

    _field(page, "sessions").fill("0")
    page.wait_for_selector("[data-field=sessions]:has-text('greater than or equal to 1')")
    assert page.get_by_test_id("calc-error").is_visible()
    assert page.evaluate(CURVE) == after_h200  # nothing computed: the charts keep the last good answer

    other = page.context.new_page()
    other.goto(shared)
    other.wait_for_function("() => document.getElementById('fig-context').data")
    assert other.locator("[data-testid=calc-form] [name=context]").input_value() == "32768"
    assert other.locator("[data-testid=calc-form] [name=hw]").input_value() == "h200"
    assert other.get_by_test_id("outputs").inner_text() == result
    assert other.evaluate(CURVE) == after_h200
    if SHOT_DIR:
        other.screenshot(path=os.path.join(SHOT_DIR, "calculator.png"), full_page=True)
    assert page.errors == []


def test_picking_a_rig_plots_its_turns_and_fills_its_model(page, web_url, owner):  # noqa: F811
    from datetime import timedelta

    from django.utils import timezone

    from inference.models import ChatSession, Rig, Turn
    from monitoring.models import RigSample

    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    arch = {"arch": "llama", "block_count": 30, "head_count": 9, "head_count_kv": 3, "embedding_length": 576,
            "context_length": 8192, "key_length": None, "value_length": None}  # fmt: skip
    RigSample.objects.create(rig=rig, ts=timezone.now(), series={"weight_bytes": 96_576_768.0},
                             detail={"kv": {"cache_type": "f16", "arch": arch, "params": 134_515_008}})  # fmt: skip
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="SmolLM2")
    start = timezone.now() - timedelta(minutes=1)
    Turn.objects.create(session=session, user_text="hi", status=Turn.Status.DONE, started_at=start,
                        finished_at=start + timedelta(seconds=5),
                        stats={"decode_tps": 61.5, "context_tokens": 300, "output_tokens": 200})  # fmt: skip

    login(page, web_url, "owner")
    page.goto(f"{web_url}/monitoring/calculator/")
    page.wait_for_function("() => document.getElementById('fig-context').data")
    computed = page.evaluate("document.querySelector('[data-testid=calc-form]').dataset.computed")
    _field(page, "rig").select_option(str(rig.pk))
    computed = _wait_computed(page, computed)
    assert "1 finished turns" in page.get_by_test_id("measured-note").inner_text()
    measured = page.evaluate(
        "() => document.getElementById('fig-context').data.filter(t => t.name.startsWith('measured'))[0]"
    )
    assert measured["x"] == [200] and measured["y"] == [61.5]
    _field(page, "model").select_option("rig")
    _wait_computed(page, computed)
    assert _field(page, "layers").input_value() == "30" and _field(page, "kv_heads").input_value() == "3"
    assert page.get_by_test_id("out-kv-per-token").inner_text() == "23,040 bytes"
    assert f"rig={rig.pk}" in page.url and "model=rig" in page.url
    assert page.errors == []
