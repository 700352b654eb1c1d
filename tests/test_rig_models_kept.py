"""The chat list shows every rig's models without asking every backend on every view: the sampler keeps each rig's
model list in Redis (inference/live/served.py), and a view asks only a rig with none kept, once.

The backends are the synthetic llama-server (bench/synthetic.py), which counts the requests it answers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from django.test import Client
from django.urls import reverse

from inference.live import served
from inference.models import Rig
from inference.turns import sessions
from monitoring import sampler
from monitoring.models import RigProfile


def asked(url: str) -> dict[str, int]:
    """What the synthetic backend at ``url`` answered since the last ask, by path."""
    return dict(httpx.get(f"{url}/_synthetic/requests", timeout=5).json())


@pytest.fixture
def rigs(db: Any, synthetic_llama: list[str]) -> list[Rig]:
    return [
        Rig.objects.create(name=f"kept-{i}", kind=Rig.Kind.LLAMACPP, base_url=url, queue=f"q.kept-{i}")
        for i, url in enumerate(synthetic_llama)
    ]


def _chat_list(user: Any) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("inference:session_list"))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_chat_list_view_asks_no_backend_once_the_sampler_keeps_the_rigs_models(owner, rigs, synthetic_llama):
    for rig in rigs:  # one tick of the sampler's loop per rig (it stores and publishes the sample too)
        RigProfile.objects.create(rig=rig, bandwidth_gbs=100.0, bandwidth_source="setting")  # no bandwidth probe
        asyncio.run(sampler.rig_loop(rig.pk, 1.0, ticks=1))
    for url in synthetic_llama:
        asked(url)  # forget the sampler's own reads

    page = _chat_list(owner)

    assert page.count('<option value="synthetic">') == len(rigs) + 1  # each rig's picker, and 'Any rig' serving it
    assert [asked(url) for url in synthetic_llama] == [{}, {}]  # not one HTTP request to any backend


@pytest.mark.django_db(transaction=True)
def test_without_a_sampler_the_first_view_asks_each_rig_once_and_the_next_ones_none(owner, rigs, synthetic_llama):
    _chat_list(owner)
    assert [asked(url) for url in synthetic_llama] == [{"/v1/models": 1}, {"/v1/models": 1}]
    page = _chat_list(owner)
    assert page.count('<option value="synthetic">') == len(rigs) + 1  # each rig's picker, and 'Any rig' serving it
    assert [asked(url) for url in synthetic_llama] == [{}, {}]


@pytest.mark.django_db(transaction=True)
def test_a_model_missing_from_the_kept_list_is_checked_with_the_backend_before_a_chat_is_refused(owner, rigs):
    rig = rigs[0]
    served.served_store(rig.pk, [])  # kept before the model was there (a pull a moment ago)
    session = sessions.session_create(owner=owner, rig=rig, model_name="synthetic")
    assert session.model_name == "synthetic"
    assert [m.name for m in served.served_get(rig.pk) or []] == ["synthetic"]  # the fresh answer is kept
    served.served_forget(rig.pk)
    assert served.served_get(rig.pk) is None
