"""/metrics through prometheus_client: parsed by its own parser; types, labels, buckets, and finished turns moving
the histograms and counters exactly."""

from __future__ import annotations

import itertools
import math
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from inference.models import ChatSession, Rig, Turn
from monitoring import turn_metrics
from monitoring.models import RigSample
from monitoring.turn_metrics import BUCKETS, Histogram, draft_counts

SERIES = {"decode_tps": 120.0, "bound_tps": 300.0, "busy_slots": 1.0, "total_slots": 4.0, "queue_depth": 0.0,
          "kv_used_bytes": 2304000.0, "kv_allocated_bytes": 94371840.0, "host_used_bytes": 1e9,
          "llamacpp_tokens_predicted_total": 4000.0, "llamacpp_prompt_tokens_total": 900.0,
          "llamacpp_spec_decode_num_draft_tokens_total": 100.0,
          "llamacpp_spec_decode_num_accepted_tokens_total": 80.0, "spec_acceptance": 0.8}  # fmt: skip
HISTOGRAMS = ("rigdash_time_to_first_token_seconds", "rigdash_inter_token_latency_seconds",
              "rigdash_request_duration_seconds", "rigdash_queue_wait_seconds")  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_totals(monkeypatch):
    """Each test's rows are rolled back: a process-wide fold from an earlier test would still count them."""
    monkeypatch.setattr(turn_metrics, "turn_totals", turn_metrics.TurnTotals())
    from monitoring import prometheus

    monkeypatch.setattr(prometheus, "turn_totals", turn_metrics.turn_totals)


@pytest.fixture
def box(db):
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    detail = {"sources": {"backend": {"ok": True}}, "model": "SmolLM2", "turns": []}
    RigSample.objects.create(rig=rig, ts=timezone.now(), series=SERIES, detail=detail)
    return rig


def _finish(session, *, status="done", ttft_ms=50.0, gaps=(5.0, 7.5, 10.0), e2e_ms=80.0, queue_s=0.2, drafts=None,
            prompt=12, output=4, created_ago_s=0.0):  # fmt: skip
    created = timezone.now() - timedelta(seconds=created_ago_s)
    timings = {"prompt_n": prompt, "predicted_n": output}
    if drafts:
        timings.update(draft_n=drafts[0], draft_n_accepted=drafts[1])
    stats = {"ttft_ms": ttft_ms, "inter_token_gaps_ms": list(gaps), "e2e_ms": e2e_ms, "backend_timings": timings}
    turn = Turn.objects.create(session=session, user_text="hi", status=Turn.Status.DECODING)
    Turn.objects.filter(pk=turn.pk).update(
        status=status, stats=stats, created_at=created, started_at=created + timedelta(seconds=queue_s),
        finished_at=timezone.now(), prompt_tokens=prompt, output_tokens=output,
    )  # fmt: skip
    return turn


def scrape(admin_user, client=None):
    if client is None:
        client = Client()
        client.force_login(admin_user)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {family.name: family for family in text_string_to_metric_families(response.content.decode())}


def samples(family, suffix="", **labels):
    return [s for s in family.samples if s.name == family.name + suffix and labels.items() <= s.labels.items()]


def value(family, suffix="", **labels):
    found = samples(family, suffix, **labels)
    assert len(found) == 1, (family.name, suffix, labels, family.samples)
    return found[0].value


def _check_histogram(family):
    """Buckets ascend by le and are cumulative, +Inf equals _count."""
    series = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in family.samples}
    for labels in series:
        wanted = dict(labels)
        buckets = [(float(s.labels["le"]), s.value) for s in samples(family, "_bucket", **wanted)]
        assert [le for le, _ in buckets] == sorted(le for le, _ in buckets) and math.isinf(buckets[-1][0])
        assert all(a <= b for (_, a), (_, b) in itertools.pairwise(buckets))
        assert buckets[-1][1] == value(family, "_count", **wanted)


def test_types_labels_and_buckets(box, owner, other_user, admin_user):
    Group.objects.create(name="team-b").user_set.add(owner)
    Group.objects.create(name="team-a").user_set.add(owner)
    mine = ChatSession.objects.create(owner=owner, rig=box, model_name="SmolLM2")
    theirs = ChatSession.objects.create(owner=other_user, rig=box, model_name="SmolLM2")
    _finish(mine, drafts=(10, 7))
    _finish(mine, status="cancelled", ttft_ms=None, gaps=(), e2e_ms=None, prompt=None, output=None)
    _finish(theirs, gaps=(2.5,), output=2)
    metrics = scrape(admin_user)

    for name in HISTOGRAMS:
        assert metrics[name].type == "histogram"
        _check_histogram(metrics[name])
    counters = (
        "rigdash_turns",
        "rigdash_prompt_tokens",
        "rigdash_generation_tokens",
        "rigdash_draft_tokens",
        "rigdash_backend_tokens_predicted",
        "rigdash_backend_prompt_tokens",
        "rigdash_backend_draft_tokens",
    )
    for name in counters:
        assert metrics[name].type == "counter", name
        assert all(s.name == name + "_total" for s in metrics[name].samples)
    for name in ("rigdash_decode_tokens_per_second", "rigdash_kv_used_bytes", "rigdash_rig_up"):
        assert metrics[name].type == "gauge"
    assert value(metrics["rigdash_backend_tokens_predicted"], "_total", rig="box") == 4000
    assert value(metrics["rigdash_backend_draft_acceptance_ratio"], rig="box") == 0.8

    ttft = metrics["rigdash_time_to_first_token_seconds"]
    assert value(ttft, "_count", rig="box", model="SmolLM2") == 2  # the cancelled turn never had a first token
    assert value(ttft, "_sum", rig="box", model="SmolLM2") == pytest.approx(0.1)
    itl = metrics["rigdash_inter_token_latency_seconds"]
    assert value(itl, "_count", rig="box", model="SmolLM2") == 4
    assert value(itl, "_bucket", rig="box", le="0.005") == 2  # 2.5 and 5.0 ms: a value on a bound falls in it
    assert value(itl, "_bucket", rig="box", le="0.0075") == 3
    assert value(metrics["rigdash_queue_wait_seconds"], "_count", rig="box") == 3
    turns = metrics["rigdash_turns"]
    assert value(turns, "_total", status="done") == 2 and value(turns, "_total", status="cancelled") == 1
    generated = metrics["rigdash_generation_tokens"]
    assert value(generated, "_total", group="team-a") == 4  # owner's first group by name
    assert value(generated, "_total", group="none") == 2
    assert not samples(generated, "_total", group="team-b")
    assert value(metrics["rigdash_draft_tokens"], "_total", rig="box") == 10
    assert value(metrics["rigdash_draft_accepted_tokens"], "_total", rig="box") == 7


def test_finished_turns_move_the_histograms_and_nothing_counts_twice(box, owner, admin_user):
    session = ChatSession.objects.create(owner=owner, rig=box, model_name="SmolLM2")
    _finish(session, created_ago_s=300)  # settled: folded into the process's totals
    running = Turn.objects.create(session=session, user_text="still going", status=Turn.Status.DECODING)
    _finish(session, created_ago_s=200, ttft_ms=2000.0, e2e_ms=4000.0)  # above the active turn: read each scrape
    first = scrape(admin_user)
    ttft = first["rigdash_time_to_first_token_seconds"]
    assert value(ttft, "_count", rig="box") == 2
    assert value(ttft, "_bucket", rig="box", le="0.05") == 1 and value(ttft, "_bucket", rig="box", le="2.5") == 2

    assert scrape(admin_user)["rigdash_time_to_first_token_seconds"].samples == ttft.samples  # no double count
    Turn.objects.filter(pk=running.pk).update(
        status="done", stats={"ttft_ms": 20.0, "e2e_ms": 30.0, "inter_token_gaps_ms": [1.0]},
        started_at=running.created_at, finished_at=timezone.now(), output_tokens=5,
    )  # fmt: skip
    _finish(session, status="failed", ttft_ms=None, gaps=(), e2e_ms=None, output=0)
    after = scrape(admin_user)
    ttft = after["rigdash_time_to_first_token_seconds"]
    assert value(ttft, "_count", rig="box") == 3
    assert value(ttft, "_bucket", rig="box", le="0.025") == 1
    assert value(after["rigdash_request_duration_seconds"], "_sum", rig="box") == pytest.approx(0.08 + 4 + 0.03)
    assert value(after["rigdash_turns"], "_total", status="failed") == 1
    assert value(after["rigdash_turns"], "_total", status="done") == 3
    assert value(after["rigdash_generation_tokens"], "_total", group="none") == 4 + 4 + 5 + 0
    assert scrape(admin_user)["rigdash_turns"].samples == after["rigdash_turns"].samples


def test_a_scrape_reads_no_history_twice_even_behind_a_waiting_turn(
    box, owner, admin_user, django_assert_max_num_queries
):
    session = ChatSession.objects.create(owner=owner, rig=box, model_name="SmolLM2")
    waiting = Turn.objects.create(session=session, user_text="queued behind a rig that is down")
    Turn.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(seconds=900))
    for _ in range(30):
        _finish(session, created_ago_s=600)
    client = Client()
    client.force_login(admin_user)
    scrape(admin_user, client)
    totals = turn_metrics.turn_totals
    assert totals._through_id == Turn.objects.latest("id").pk and totals._pending == {waiting.pk}
    # The session and user, the rig and its sample, rig names, the mark, the pending turn, the recent turns, groups:
    # the same whatever the history.
    with django_assert_max_num_queries(9):
        metrics = scrape(admin_user, client)
    assert value(metrics["rigdash_turns"], "_total", status="done") == 30
    Turn.objects.filter(pk=waiting.pk).update(status="cancelled", finished_at=timezone.now())
    metrics = scrape(admin_user, client)
    assert value(metrics["rigdash_turns"], "_total", status="cancelled") == 1 and not totals._pending
    assert value(scrape(admin_user)["rigdash_turns"], "_total", status="cancelled") == 1


def test_stored_stats_from_a_backend_are_untrusted():
    totals = turn_metrics.Totals()
    row = {"rig_id": None, "session__rig_id": 1, "session__model_name": "m", "session__owner_id": 1, "status": "done",
           "prompt_tokens": None, "output_tokens": None, "created_at": timezone.now(), "started_at": None,
           "stats": {"ttft_ms": "fast", "e2e_ms": float("inf"), "inter_token_gaps_ms": [1.0, "x", -3, None, True],
                     "backend_timings": {"draft_n": 5, "draft_n_accepted": 9}}}  # fmt: skip
    totals.add(row)
    assert ("ttft", (1, "m")) not in totals.histograms and ("duration", (1, "m")) not in totals.histograms
    assert totals.histograms[("itl", (1, "m"))].counts[0] == 1 and sum(totals.histograms[("itl", (1, "m"))].counts) == 1
    assert not totals.draft_tokens  # more accepted than drafted: not llama-server's counts
    assert draft_counts({"backend_timings": {"draft_n": 12, "draft_n_accepted": 9}}) == (12, 9)
    assert draft_counts({"backend_timings": {"prompt_n": 3}}) is None
    assert draft_counts({"backend_timings": "junk"}) is None


def test_histogram_buckets_follow_le():
    histogram = Histogram(BUCKETS["itl"])
    for gap_s in (0.001, 0.0011, 99.0):
        histogram.observe(gap_s)
    cumulative = dict(histogram.cumulative())
    assert cumulative["0.001"] == 1 and cumulative["0.0025"] == 2 and cumulative["5.0"] == 2
    assert cumulative["+Inf"] == 3 and histogram.total == pytest.approx(99.0021)


def test_api_requests_and_tokens_are_counted_per_key(box, owner, other_user, admin_user):
    """Each key's finished requests by status, and their tokens; a chat's own turns (no key) and a key deleted
    since are not in them."""
    from inference.board import apikeys

    editor = apikeys.api_key_create(owner=owner, name="editor").key
    agent = apikeys.api_key_create(owner=other_user, name='agent "x"').key
    gone = apikeys.api_key_create(owner=owner, name="gone").key
    by_key = {k: ChatSession.objects.create(owner=k.owner, rig=box, model_name="SmolLM2", api_key=k)
              for k in (editor, agent, gone)}  # fmt: skip
    _finish(by_key[editor], created_ago_s=300, prompt=10, output=3)  # folded: settled
    _finish(by_key[editor], prompt=20, output=5)  # read at each scrape
    _finish(by_key[editor], status="cancelled", prompt=7, output=1)
    _finish(by_key[agent], prompt=4, output=2)
    _finish(by_key[gone], prompt=100, output=100)
    _finish(ChatSession.objects.create(owner=owner, rig=box, model_name="SmolLM2"), prompt=50, output=50)
    gone.delete()
    metrics = scrape(admin_user)

    requests = metrics["rigdash_api_key_requests"]
    assert requests.type == "counter"
    assert value(requests, "_total", key_id=str(editor.pk), key="editor", owner="owner", status="done") == 2
    assert value(requests, "_total", key_id=str(editor.pk), status="cancelled") == 1
    assert value(requests, "_total", key='agent "x"', owner=other_user.username, status="done") == 1
    assert {s.labels["key"] for s in requests.samples} == {"editor", 'agent "x"'}
    prompt, generated = metrics["rigdash_api_key_prompt_tokens"], metrics["rigdash_api_key_generation_tokens"]
    assert value(prompt, "_total", key="editor") == 37 and value(generated, "_total", key="editor") == 9
    assert value(prompt, "_total", key='agent "x"') == 4 and value(generated, "_total", key='agent "x"') == 2
    assert scrape(admin_user)["rigdash_api_key_requests"].samples == requests.samples  # nothing counts twice
