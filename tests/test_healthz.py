"""GET /healthz: 200 with everything up, 503 when anything is down; what is down, and why, only for the metrics token
or an admin session; the report cached a few seconds."""

from __future__ import annotations

import os

import pytest
from django.test import Client

from inference.models import Rig
from monitoring import queues
from tests.conftest import free_port


def _admin() -> Client:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_user("healthz-admin", password="x-Long-pw-1", is_staff=True))
    return client


@pytest.mark.django_db
def test_healthz_is_ok_when_database_redis_worker_and_backend_answer(celery_worker, rig):
    queues.forget()
    response = _admin().get("/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["down"] == []
    assert body["checks"]["rigs"][rig.name]["ok"] is True
    assert body["checks"]["database"]["detail"] == "postgresql"
    assert celery_worker in body["checks"]["workers"]["workers"]


@pytest.mark.django_db
def test_healthz_reports_a_stopped_backend_as_down(celery_worker, rig):
    queues.forget()
    Rig.objects.create(name="stopped", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="rig.s")
    response = _admin().get("/healthz")
    body = response.json()
    assert response.status_code == 503
    # Its queue (rig.s) has no worker either: that is reported on its own.
    assert body["down"] == ["rig:stopped", "queue:stopped"]
    assert body["checks"]["rigs"]["stopped"]["ok"] is False
    assert "unreachable" in body["checks"]["rigs"]["stopped"]["detail"]
    assert body["checks"]["rigs"][rig.name]["ok"] is True


def test_worker_check_reports_down_when_no_worker_consumes(settings):
    """A broker nobody consumes from (an empty Redis database): the worker check says so."""
    from celery import Celery

    from monitoring.health import check_workers

    lonely = Celery("lonely", broker=settings.REDIS_URL.rsplit("/", 1)[0] + "/13")
    # Control broadcasts are Redis PUBLISHes, which ignore the database number: on an exchange of its own, no
    # worker of this server (the suite's, another run's) can answer.
    lonely.conf.control_exchange = f"lonely-{os.getpid()}"
    try:
        result = check_workers(timeout_s=0.5, app=lonely)
    finally:
        lonely.close()
    assert result == {"ok": False, "detail": "no worker answered", "workers": []}


@pytest.mark.django_db
def test_anonymous_healthz_says_only_up_or_down_and_the_token_gets_the_detail(settings, monkeypatch):
    from monitoring import health

    monkeypatch.setattr(health, "check_workers", lambda: {"ok": False, "detail": "none at host-a", "workers": []})
    settings.RIGDASH = type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "metrics_token": "s3cret-token"})
    Rig.objects.create(name="stopped", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="rig.s")
    response = Client().get("/healthz")
    assert (response.status_code, response.json()) == (503, {"status": "down"})
    assert b"127.0.0.1" not in response.content and b"host-a" not in response.content
    detailed = Client().get("/healthz", headers={"Authorization": "Bearer s3cret-token"})
    assert detailed.status_code == 503 and "rig:stopped" in detailed.json()["down"]
    assert Client().get("/healthz", headers={"Authorization": "Bearer wrong"}).json() == {"status": "down"}


@pytest.mark.django_db
def test_the_backend_fan_out_is_cached_for_a_few_seconds(monkeypatch):
    from monitoring import health

    calls: list[str] = []
    monkeypatch.setattr(health, "check_workers", lambda: {"ok": True, "detail": "1 worker(s)", "workers": ["w"]})
    monkeypatch.setattr(health, "check_rig", lambda rig: calls.append(rig.name) or {"ok": True, "detail": "ok"})
    monkeypatch.setattr(health, "rig_consumers", lambda rigs: {r.name: {"ok": True} for r in rigs})
    Rig.objects.create(name="cached", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="rig.c")
    for _ in range(5):
        assert Client().get("/healthz").status_code == 200
    assert calls == ["cached"]
    health.health_report(max_age_s=0)
    assert calls == ["cached", "cached"]
