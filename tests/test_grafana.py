"""docs/grafana/rigdash.json: every metric its panels' PromQL names is in a real /metrics scrape (a sample the
sampler took of the real llama-server, and finished turns)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from inference.models import ChatSession, Turn
from monitoring import prometheus, turn_metrics
from monitoring.sampling import RigSampler
from monitoring.services import sample_store

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "rigdash.json"
# Named by panels, present only with what this machine lacks: a GPU (NVML), a decoding slot at the sample's
# instant, a draft model on the backend (tests/test_speculative.py scrapes that one).
NEEDS_MORE = {
    "rigdash_gpu_memory_used_bytes", "rigdash_backend_vram_bytes", "rigdash_roofline_ratio",
    "rigdash_backend_draft_acceptance_ratio",
}  # fmt: skip
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers that are not functions, keywords, label names in
    matchers or grouping clauses, range durations or numbers."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings (label values, legend templates)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = match.group(), expr[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def panel_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append((f"variable {variable['name']}", variable["definition"].replace("label_values", "x")))
    return exprs


def test_metric_names_are_read_from_promql():
    expr = (
        'histogram_quantile(0.95, sum by (le, rig) (rate(rigdash_ttft_bucket{rig=~"$rig"}[$__rate_interval])))'
        " / on (rig) group_left rigdash_slots + x(rigdash_up, rig)"
    )
    assert metric_names(expr) == {"rigdash_ttft_bucket", "rigdash_slots", "rigdash_up", "rig"}


@pytest.mark.llama
@pytest.mark.django_db
def test_every_grafana_query_names_metrics_a_real_scrape_has(rig, llama_url, model_name, owner, admin_user,
                                                              monkeypatch):  # fmt: skip
    monkeypatch.setattr(prometheus, "turn_totals", turn_metrics.TurnTotals())
    chat = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    assert httpx.post(f"{llama_url}/v1/chat/completions", json=chat, timeout=60).status_code == 200
    sample = asyncio.run(RigSampler(rig=rig, bandwidth_gbs=25.0).take())
    sample_store(rig_id=rig.pk, sample=sample)
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
    stats = {"ttft_ms": 40.0, "e2e_ms": 90.0, "inter_token_gaps_ms": [6.0, 7.0],
             "backend_timings": {"draft_n": 8, "draft_n_accepted": 6}}  # fmt: skip
    Turn.objects.create(session=session, user_text="hi", status="done", stats=stats, started_at=timezone.now(),
                        finished_at=timezone.now(), prompt_tokens=5, output_tokens=3)  # fmt: skip
    client = Client()
    client.force_login(admin_user)
    text = client.get("/metrics").content.decode()
    declared, with_samples = set(), set()
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        declared.update(s.name for s in family.samples)
        with_samples.update({family.name, *(s.name for s in family.samples)} if family.samples else set())

    exprs = panel_exprs()
    assert len(exprs) > 20
    named = set()
    for title, expr in exprs:
        names = metric_names(expr) - {"rig"}  # label_values(metric, rig): the label
        assert names, (title, expr)
        assert names <= declared, (title, names - declared)
        named |= names
    assert named - NEEDS_MORE <= with_samples, named - NEEDS_MORE - with_samples
    assert {"rigdash_time_to_first_token_seconds_bucket", "rigdash_inter_token_latency_seconds_bucket",
            "rigdash_kv_used_bytes", "rigdash_turns_total", "rigdash_queue_depth"} <= named  # fmt: skip
