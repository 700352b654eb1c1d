"""The calculator against the real embedded rig: llama-server with SmolLM2-135M (Q4_1) as the sampler reads it, and a
real turn through the worker as a measured point."""

from __future__ import annotations

import asyncio

import pytest
from django.test import Client
from django.utils import timezone

from inference.models import Turn
from inference.turns.submit import turn_submit
from monitoring.calculator import model as calc
from monitoring.calculator import presets as calculator_presets
from monitoring.models import RigProfile, RigSample
from monitoring.sampling import RigSampler
from tests.conftest import wait_until

pytestmark = pytest.mark.llama
GIB = 2**30


def _store_a_sample(rig):
    sample = asyncio.run(RigSampler(rig=rig).take())
    RigSample.objects.create(
        rig=rig, ts=timezone.now(), series=sample.series, detail=sample.detail, resolution_s=RigSample.RAW_S
    )
    return sample


def _api(user, **query):
    client = Client()
    client.force_login(user)
    return client.get("/api/calculator", query)


@pytest.mark.django_db
def test_the_embedded_rig_fills_the_calculator_with_what_llama_server_reports(rig, owner):
    """The sampler keeps llama-server's parameter count (/v1/models) beside the GGUF geometry: SmolLM2-135M's
    134,515,008 parameters, the preset's figure; the rig's own file size is what the calculator reads for it."""
    refused = _api(owner, rig=rig.pk, hw="rig").json()["error"]["fields"]
    assert "bandwidth is not known" in " ".join(refused["vram_gbs"])
    RigProfile.objects.create(rig=rig, bandwidth_gbs=9.5, bandwidth_source=RigProfile.BandwidthSource.PROBE)
    sample = _store_a_sample(rig)
    assert sample.detail["kv"]["params"] == calculator_presets.MODELS["smollm2-135m"].params
    body = _api(owner, rig=rig.pk, model="rig", hw="rig").json()
    inputs, result = body["inputs"], body["result"]
    assert (inputs["layers"], inputs["heads"], inputs["kv_heads"], inputs["embd"], inputs["head_dim"]) == (
        30, 9, 3, 576, 64,
    )  # fmt: skip
    assert result["kv_bytes_per_token"] == 23_040
    assert result["weight_bytes"] == pytest.approx(sample.series["weight_bytes"], rel=1e-5)
    # A uniform q4_1 estimate is 13 % short of this small model's file: its 49,152 x 576 token embeddings (a fifth of
    # its parameters, shared with the output) are stored in q8_0. Counted so, the estimate is within 0.2 %.
    params, embeddings, file_bytes = sample.detail["kv"]["params"], 49_152 * 576, sample.series["weight_bytes"]
    uniform = calc.weight_bytes(params=params, quant="q4_1")
    assert 0.85 < uniform / file_bytes < 0.89
    split = calc.weight_bytes(params=params - embeddings, quant="q4_1") + calc.weight_bytes(
        params=embeddings, quant="q8_0"
    )
    assert split == pytest.approx(file_bytes, rel=0.002)
    assert inputs["vram_gib"] == pytest.approx(sample.series["host_total_bytes"] / GIB, abs=0.01)  # a CPU rig
    assert inputs["vram_gbs"] == 9.5 and inputs["ram_gib"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_finished_turn_is_a_measured_point_beside_the_prediction(celery_worker, chat_session, owner):
    turn = turn_submit(session=chat_session, text="Count from one to twenty.", params={"max_tokens": 48})
    wait_until(lambda: Turn.objects.get(pk=turn.pk).status not in Turn.ACTIVE, timeout_s=90, what="the turn to finish")
    turn.refresh_from_db()
    assert turn.status == Turn.Status.DONE, turn.error
    stats = turn.stats
    body = _api(owner, rig=chat_session.rig.pk, model="smollm2-135m", quant="q4_1", hw="ryzen-7950x").json()
    assert body["measured"]["points"] == 1
    (measured,) = [t for t in body["figures"]["context"]["data"] if t["name"].startswith("measured")]
    assert measured["y"] == [stats["decode_tps"]]
    assert measured["x"] == [stats["context_tokens"] - stats["output_tokens"] / 2]
    (by_sessions,) = [t for t in body["figures"]["sessions"]["data"] if t["name"].startswith("measured")]
    assert by_sessions["x"] == [1]
