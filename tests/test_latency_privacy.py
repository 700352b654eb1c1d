"""Per-turn timings (inter-token gaps, TTFT, draft acceptance) of other users' turns are staff's: an ordinary user
reads their own turns' series and the aggregates over everyone's, by the latency feed and the dashboard page."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from inference.models import ChatSession, Rig, Turn
from tests.conftest import page_json

pytestmark = pytest.mark.django_db


def _finished(user, rig, gaps: list[float]) -> Turn:
    session = ChatSession.objects.create(owner=user, rig=rig, model_name="m")
    stats = {"ttft_ms": 50.0, "decode_tps": 20.0, "inter_token_gaps_ms": gaps,
             "backend_timings": {"draft_n": 10, "draft_n_accepted": 7}}  # fmt: skip
    return Turn.objects.create(
        session=session, rig=rig, user_text="hi", status="done", finished_at=timezone.now(), stats=stats
    )


@pytest.fixture
def world(owner, other_user, admin_user):
    rig = Rig.objects.create(name="box", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.box")
    mine = _finished(owner, rig, [10.0, 11.0])
    theirs = _finished(other_user, rig, [90.0, 91.0, 92.0])
    return rig, mine, theirs


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_another_user_reads_only_their_own_turns_timings_and_everyones_aggregates(world, owner):
    rig, mine, _theirs = world
    latency = _client(owner).get(f"/monitoring/api/rigs/{rig.pk}/latency").json()["latency"]
    assert [t["id"] for t in latency["turns"]] == [mine.pk]
    assert latency["gap_count"] == 5 and latency["p99_ms"] >= 90  # the percentiles stay over everyone's turns
    assert latency["speculative"]["turns"] == 2 and latency["speculative"]["drafted"] == 20


def test_the_dashboard_page_carries_no_other_users_turn_series(world, owner):
    rig, mine, _theirs = world
    html = _client(owner).get(f"/monitoring/rigs/{rig.pk}/").content.decode()
    figures = page_json(html)["figures"]
    assert figures["ttft"]["data"][0]["x"] == [f"#{mine.pk}"]
    assert figures["gaps"]["data"][0]["y"] == [10.0, 11.0]
    assert figures["histogram"]["data"][0]["x"] == [10.0, 11.0]


def test_staff_read_every_turns_timings(world, admin_user):
    rig, mine, theirs = world
    latency = _client(admin_user).get(f"/monitoring/api/rigs/{rig.pk}/latency").json()["latency"]
    assert [t["id"] for t in latency["turns"]] == [mine.pk, theirs.pk]
