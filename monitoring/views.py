from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from monitoring.health import health_report


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database, Redis, a Celery worker and every enabled rig answer; 503 naming what is down."""
    report = health_report()
    return JsonResponse(report, status=200 if not report["down"] else 503)
