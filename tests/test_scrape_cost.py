"""What a /metrics scrape costs as the history of finished turns grows (a measurement, not a timed test: run it
with ``RIGDASH_BENCH_SCRAPE=1 ./scripts/test tests/test_scrape_cost.py -s``; figures in docs/benchmarks.md)."""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from inference.models import ChatSession, Rig, Turn
from monitoring import prometheus, turn_metrics

pytestmark = pytest.mark.skipif(not os.environ.get("RIGDASH_BENCH_SCRAPE"), reason="set RIGDASH_BENCH_SCRAPE=1")
GAPS = 100


def _timed(client: Client, times: int) -> list[float]:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        assert client.get("/metrics").status_code == 200
        spent.append((time.perf_counter() - started) * 1000)
    return spent


@pytest.mark.django_db
@pytest.mark.parametrize("turns", [1_000, 10_000])
def test_scrape_cost(admin_user, owner, monkeypatch, turns):
    monkeypatch.setattr(prometheus, "turn_totals", turn_metrics.TurnTotals())
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    old = timezone.now() - timedelta(days=1)
    waiting = Turn.objects.create(session=session, user_text="queued before all of them")
    stats = {"ttft_ms": 50.0, "e2e_ms": 800.0, "inter_token_gaps_ms": [7.0 + i % 5 for i in range(GAPS)]}
    Turn.objects.bulk_create(
        Turn(session=session, user_text="x", status="done", stats=stats, started_at=old, finished_at=old,
             prompt_tokens=10, output_tokens=GAPS + 1)
        for _ in range(turns)
    )  # fmt: skip
    Turn.objects.filter(session=session).update(created_at=old)
    client = Client()
    client.force_login(admin_user)
    first = _timed(client, 1)[0]
    steady = _timed(client, 7)
    assert prometheus.turn_totals._pending == {waiting.pk}
    print(
        f"\nSCRAPE {turns} finished turns x {GAPS} gaps, one turn waiting since before them: "
        f"first scrape {first:.0f} ms, then median {statistics.median(steady):.1f} ms (max {max(steady):.1f})"
    )
