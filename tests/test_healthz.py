"""GET /healthz: 200 with everything up; 503 naming what is down."""

from __future__ import annotations

import pytest
from django.test import Client

from inference.models import Rig
from monitoring import queues
from tests.conftest import free_port


@pytest.mark.django_db
def test_healthz_is_ok_when_database_redis_worker_and_backend_answer(celery_worker, rig):
    queues.forget()
    response = Client().get("/healthz")
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
    response = Client().get("/healthz")
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
    try:
        result = check_workers(timeout_s=0.5, app=lonely)
    finally:
        lonely.close()
    assert result == {"ok": False, "detail": "no worker answered", "workers": []}
