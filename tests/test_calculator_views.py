"""The calculator's page and JSON endpoint: login, presets and overrides, a rig's own figures and finished turns,
and bad input answered with a 400 naming each field, nothing computed."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from inference.models import ChatSession, Rig, Turn
from monitoring.calculator import model as calc
from monitoring.models import RigProfile, RigSample

pytestmark = pytest.mark.django_db
GIB = 2**30
SMOLLM2_ARCH = {"arch": "llama", "block_count": 30, "head_count": 9, "head_count_kv": 3, "embedding_length": 576,
                "context_length": 8192, "key_length": None, "value_length": None}  # fmt: skip


def _client(user=None):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _api(client, **query):
    return client.get(f"/api/calculator?{urlencode(query)}")


@pytest.fixture
def sampled_rig(db):
    """A CPU rig as the sampler sees it: SmolLM2's geometry from its GGUF file, its size and parameter count from
    llama-server's /v1/models, the host's RAM, and a bandwidth the probe measured."""
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    RigProfile.objects.create(rig=rig, bandwidth_gbs=12.5, bandwidth_source=RigProfile.BandwidthSource.PROBE)
    RigSample.objects.create(
        rig=rig, ts=timezone.now(),
        series={"weight_bytes": 98_940_000.0, "host_total_bytes": 8 * GIB},
        detail={"kv": {"cache_type": "q8_0", "arch": SMOLLM2_ARCH, "params": 134_515_008}},
    )  # fmt: skip
    return rig


def test_the_endpoint_needs_a_login_and_the_page_redirects_to_it(db):
    response = _api(_client())
    assert response.status_code == 401 and response.json()["error"]["code"] == "not_authenticated"
    page = _client().get("/monitoring/calculator/")
    assert page.status_code == 302 and page["Location"].startswith("/login/")


def test_defaults_compute_every_output(owner):
    body = _api(_client(owner)).json()
    result = body["result"]
    assert body["inputs"]["model"] == "llama-3.1-8b" and body["inputs"]["hw"] == "rtx-4090"
    assert result["kv_bytes_per_token"] == 131_072
    assert result["weight_bytes"] == pytest.approx(8_030_261_248 * 4.84 / 8)
    assert result["placement"]["fits"] and result["placement"]["spilled_bytes"] == 0
    full = result["at_full_context"]
    assert full["per_session_tps"] == pytest.approx(1008e9 / (result["weight_bytes"] + 8192 * 131_072))
    assert result["prefill_s"] == pytest.approx(2 * 8_030_261_248 * 1000 / 165.2e12)
    assert result["energy"]["cost_per_million"] == pytest.approx(450 / full["total_tps"] * 1e6 / 3.6e6 * 0.30)
    assert result["reading_tps"] == pytest.approx(calc.READING_TPS)
    assert set(body["figures"]) == {"context", "sessions"}
    assert body["url"].startswith("/monitoring/calculator/?") and "vram_gbs=1008" in body["url"]


def test_a_preset_fills_fields_and_a_field_in_the_query_wins(owner):
    client = _client(owner)
    h200 = _api(client, hw="h200").json()["inputs"]
    assert (h200["vram_gib"], h200["vram_gbs"], h200["host"], h200["ram_gbs"]) == (141, 4800, "ddr5-8ch", 307.2)
    edited = _api(client, hw="rtx-4090", vram_gib="20", host="ddr4-2ch").json()["inputs"]
    assert (edited["vram_gib"], edited["vram_gbs"], edited["ram_gbs"]) == (20, 1008, 51.2)


def test_the_query_it_returns_restores_the_same_result(owner):
    client = _client(owner)
    first = _api(client, model="qwen2.5-7b", quant="q8_0", kv_type="q4_0", context="32768", sessions="3",
                 hw="rtx-3090", spill="link", price="0.12").json()  # fmt: skip
    again = client.get(f"/api/calculator?{first['query']}").json()
    assert again["result"] == first["result"] and again["inputs"] == first["inputs"]
    page = client.get(first["url"])
    config = json.loads(json.dumps(page.context["page_config"]))  # what json_script hands the page's script
    assert page.status_code == 200 and config["answer"]["result"] == first["result"]
    assert 'value="32768"' in page.content.decode() and 'id="page-config"' in page.content.decode()


def test_a_model_that_spills_says_how_much_and_reads_slower(owner):
    client = _client(owner)
    fits = _api(client, model="llama-3.1-70b", quant="q4_k_m", hw="h200", context="8192").json()["result"]
    spills = _api(client, model="llama-3.1-70b", quant="q4_k_m", hw="rtx-4090", context="8192").json()["result"]
    assert fits["placement"]["spilled_bytes"] == 0
    assert spills["placement"]["spilled_bytes"] > 10 * GIB and spills["spill_sessions"] == 1
    assert spills["at_full_context"]["per_session_tps"] < fits["at_full_context"]["per_session_tps"] / 10
    nowhere = _api(client, model="llama-3.1-70b", quant="f16", hw="rtx-4090", host="ddr4-2ch").json()["result"]
    assert not nowhere["placement"]["fits"] and nowhere["at_full_context"] is None and nowhere["energy"] is None


@pytest.mark.parametrize(
    ("query", "fields"),
    [
        ({"context": "-5"}, {"context"}),
        ({"hw": "gtx-9999"}, {"hw"}),
        ({"model": "gpt-17"}, {"model"}),
        ({"vram_gbs": "0"}, {"vram_gbs"}),
        ({"vram_gbs": "1e9", "link_gbs": "-1"}, {"vram_gbs", "link_gbs"}),
        ({"params_b": "-1", "layers": "0"}, {"params_b", "layers"}),
        ({"context": "1000", "prompt": "2000"}, {"prompt"}),
        ({"heads": "32", "kv_heads": "5"}, {"kv_heads"}),
        ({"sessions": "many"}, {"sessions"}),
        ({"quant": "q9_9", "kv_type": "f8"}, {"quant", "kv_type"}),
        ({"vram_gib": "24", "reserved_gib": "24"}, {"reserved_gib"}),
        ({"ram_gib": "64", "ram_gbs": "0"}, {"ram_gbs"}),
        ({"model": "rig"}, {"rig"}),
        ({"rig": "999999"}, {"rig"}),
        ({"rig": "abc"}, {"rig"}),
        ({"rig": "9" * 30}, {"rig"}),
        ({"weight_gib": "nan"}, {"weight_gib"}),
        ({"watts": "inf"}, {"watts"}),
    ],
)
def test_bad_input_is_a_400_naming_each_field_and_nothing_is_computed(owner, query, fields):
    response = _api(_client(owner), **query)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and set(error["fields"]) >= fields, error
    assert "result" not in response.json() and "figures" not in response.json()
    for field in fields:
        assert field in error["message"]


def test_the_page_shows_bad_input_beside_its_field(owner):
    page = _client(owner).get("/monitoring/calculator/?context=-5&hw=gtx-9999")
    assert page.status_code == 400
    html = page.content.decode()
    assert "Ensure this value is greater than or equal to 1" in html and "gtx-9999 is not one of" in html
    assert page.context["page_config"]["answer"] is None


def test_a_rig_fills_the_model_and_memory_from_what_it_measured(owner, sampled_rig):
    body = _api(_client(owner), rig=str(sampled_rig.pk), model="rig", hw="rig").json()
    inputs = body["inputs"]
    assert (inputs["layers"], inputs["heads"], inputs["kv_heads"], inputs["embd"]) == (30, 9, 3, 576)
    assert inputs["kv_type"] == "q8_0" and inputs["params_b"] == pytest.approx(0.134515008)
    assert inputs["weight_gib"] == pytest.approx(98_940_000 / GIB, abs=1e-4)
    assert (inputs["vram_gib"], inputs["vram_gbs"], inputs["ram_gib"]) == (8, 12.5, 0)  # a CPU rig: RAM is fast
    assert body["result"]["kv_bytes_per_token"] == pytest.approx(23_040 * 34 / 32 / 2)
    assert body["result"]["weight_bytes"] == pytest.approx(98_940_000, rel=1e-5)
    assert body["result"]["prefill_s"] is None and body["result"]["energy"] is None  # no compute or power known


def test_a_rig_without_geometry_is_refused_for_its_model(owner, db):
    rig = Rig.objects.create(name="blank", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.blank")
    response = _api(_client(owner), rig=str(rig.pk), model="rig")
    assert response.status_code == 400 and "no model geometry" in response.json()["error"]["fields"]["model"][0]
    disabled = Rig.objects.create(name="off", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.off",
                                  enabled=False)  # fmt: skip
    assert _api(_client(owner), rig=str(disabled.pk)).status_code == 400


def _turn(session, *, start, seconds, decode_tps, context, output):
    return Turn.objects.create(
        session=session, user_text="hi", status=Turn.Status.DONE, started_at=start,
        finished_at=start + timedelta(seconds=seconds),
        stats={"decode_tps": decode_tps, "context_tokens": context, "output_tokens": output},
    )  # fmt: skip


def test_finished_turns_are_measured_points_on_both_charts(owner, other_user, sampled_rig):
    now = timezone.now()
    mine = ChatSession.objects.create(owner=owner, rig=sampled_rig, model_name="SmolLM2")
    theirs = ChatSession.objects.create(owner=other_user, rig=sampled_rig, model_name="SmolLM2")
    alone = _turn(mine, start=now - timedelta(minutes=5), seconds=10, decode_tps=40.0, context=600, output=200)
    a = _turn(mine, start=now - timedelta(minutes=1), seconds=10, decode_tps=25.0, context=1200, output=400)
    _turn(theirs, start=now - timedelta(minutes=1, seconds=-2), seconds=10, decode_tps=24.0, context=900, output=100)
    Turn.objects.create(session=mine, user_text="x", status=Turn.Status.FAILED, stats={"decode_tps": 1.0})
    body = _api(_client(owner), rig=str(sampled_rig.pk)).json()
    assert body["measured"] == {"rig": sampled_rig.pk, "points": 3}
    context_fig = body["figures"]["context"]
    measured = next(t for t in context_fig["data"] if t["name"].startswith("measured"))
    assert measured["x"] == [500.0, 1000.0, 850.0] and measured["y"] == [40.0, 25.0, 24.0]
    sessions = next(t for t in body["figures"]["sessions"]["data"] if t["name"].startswith("measured"))
    assert sessions["x"] == [1, 2, 2]
    assert all("hi" not in text and "other" not in text for text in measured["text"])  # no prompt, no user
    assert f"turn {alone.pk}" in measured["text"][0] and f"turn {a.pk}" in measured["text"][1]


def test_the_charts_mark_the_spill_point(owner):
    body = _api(_client(owner), model="llama-2-7b", quant="q4_0", hw="rtx-4090", context="4096", sessions="4").json()
    result = body["result"]
    sessions_fig = body["figures"]["sessions"]
    spill = next(t for t in sessions_fig["data"] if t["name"].startswith("spills"))
    assert spill["x"] == [result["spill_sessions"]] * 2 and sessions_fig["meta"]["spill_at"] == result["spill_sessions"]
    context_fig = body["figures"]["context"]
    assert context_fig["meta"]["spill_at"] == result["spill_context"]
    predicted = context_fig["data"][0]
    assert predicted["x"][0] == 128 and 4096 in predicted["x"]
    assert any(t["name"].startswith("reading pace") for t in context_fig["data"])


def test_a_rig_that_does_not_report_its_parameter_count_asks_for_it(owner, db):
    """An Ollama rig: the geometry comes from /api/show (kept per loaded model), the parameter count does not."""
    rig = Rig.objects.create(name="oll", kind="ollama", base_url="http://127.0.0.1:9", queue="rig.oll")
    RigSample.objects.create(
        rig=rig, ts=timezone.now(), series={"weight_bytes": 270_000_000.0},
        detail={"kv": {"cache_type": "f16", "arch": None},
                "loaded_models": [{"name": "smollm2:135m", "size_bytes": 270_000_000, "arch": SMOLLM2_ARCH}]},
    )  # fmt: skip
    refused = _api(_client(owner), rig=str(rig.pk), model="rig")
    assert refused.status_code == 400
    assert "does not report its parameter count" in " ".join(refused.json()["error"]["fields"]["params_b"])
    body = _api(_client(owner), rig=str(rig.pk), model="rig", params_b="0.135").json()
    assert body["inputs"]["layers"] == 30 and body["result"]["weight_bytes"] == pytest.approx(270e6, rel=1e-5)


def test_a_gpu_rig_takes_its_vram_from_nvml_and_its_bandwidth_from_the_gpus_spec_sheet(owner, db):
    """What the sampler stored on an H200 (docs/monitoring.md: NVML said 140.4 GiB): the VRAM's bandwidth is not
    measured, so it comes from the preset of the GPU NVML names; the probe's figure is the system RAM's."""
    rig = Rig.objects.create(name="gpu", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.gpu")
    RigProfile.objects.create(rig=rig, bandwidth_gbs=11.0, bandwidth_source=RigProfile.BandwidthSource.PROBE)
    series = {"gpu0_memory_total_bytes": 140.4 * GIB, "host_total_bytes": 128 * GIB}
    sample = RigSample.objects.create(rig=rig, ts=timezone.now(), series=series,
                                      detail={"gpus": [{"index": 0, "name": "NVIDIA H200"}]})  # fmt: skip
    body = _api(_client(owner), rig=str(rig.pk), hw="rig").json()
    inputs = body["inputs"]
    assert (inputs["vram_gib"], inputs["vram_gbs"], inputs["reserved_gib"]) == (140.4, 4800, 0.6)
    assert (inputs["ram_gib"], inputs["ram_gbs"]) == (128, 11.0)
    sample.detail = {"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_bandwidth_gbs": 4915.2}]}  # NVML's peak
    sample.save()
    assert _api(_client(owner), rig=str(rig.pk), hw="rig").json()["inputs"]["vram_gbs"] == 4915.2
    sample.detail = {"gpus": [{"index": 0, "name": "NVIDIA L4"}]}  # no preset for it
    sample.save()
    refused = _api(_client(owner), rig=str(rig.pk), hw="rig")
    assert refused.status_code == 400 and "bandwidth is not known" in " ".join(
        refused.json()["error"]["fields"]["vram_gbs"]
    )
    assert _api(_client(owner), rig=str(rig.pk), hw="rig", vram_gbs="300").status_code == 200
