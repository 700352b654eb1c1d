"""Dashboards, their JSON feeds, /healthz and the Prometheus export."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from inference.models import Rig
from monitoring import plotting, profiles, selectors, services
from monitoring.health import health_report
from monitoring.queues import consumers, rig_consumers
from rigdash.access import is_staff
from rigdash.fastjson import FastJsonResponse


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database, Redis, a Celery worker and every enabled rig answer, else 503. Anonymous callers get
    only up or down; what is down and why (rig URLs, worker host names, errors) needs the metrics token or an admin
    session. The report is cached a few seconds (``monitoring.health.HEALTH_CACHE_S``)."""
    report = health_report()
    status = 200 if not report["down"] else 503
    if not _metrics_allowed(request):
        return JsonResponse({"status": "up" if status == 200 else "down"}, status=status)
    return JsonResponse(report, status=status)


def _range_s(request: HttpRequest) -> int:
    return selectors.RANGES_S.get(request.GET.get("range", "15m"), selectors.RANGES_S["15m"])


def _viewer_latency(request: HttpRequest, rig: Rig) -> dict[str, Any]:
    """The rig's latency as the viewer may see it: staff, every turn's timings; others, their own turns' and the
    aggregates over everyone's (per-turn gaps and acceptance tell what someone else's turn was)."""
    return selectors.rig_latency(rig, own_turns_of=None if is_staff(request.user) else request.user.pk)


def _viewer_sample(request: HttpRequest, latest: dict[str, Any] | None) -> dict[str, object] | None:
    if latest is None:
        return None
    return selectors.redact_users(latest, viewer=request.user.get_username(), is_staff=is_staff(request.user))


@login_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    enabled = list(Rig.objects.filter(enabled=True))
    latest = selectors.rigs_latest(enabled)
    rigs = [{"rig": rig, "latest": _viewer_sample(request, latest.get(rig.pk))} for rig in enabled]
    return render(request, "monitoring/overview.html", {"rigs": rigs, "page_config": {"overview": True}})


@login_required
@require_http_methods(["GET", "POST"])
def rig_profile(request: HttpRequest, rig_id: int) -> HttpResponse:
    """A rig's monitoring profile (staff only; 404 for everyone else)."""
    if not is_staff(request.user):
        raise Http404("No such page")
    rig = get_object_or_404(Rig, pk=rig_id)
    form = profiles.RigProfileForm(request.POST or None, instance=services.profile_for(rig))
    if request.method == "POST" and form.is_valid():
        profiles.profile_save(actor=request.user, form=form)
        return redirect("monitoring:rig_dashboard", rig_id=rig.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "monitoring/rig_profile.html", {"rig": rig, "form": form}, status=status)


@login_required
@require_GET
def rig_dashboard(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = get_object_or_404(Rig, pk=rig_id, enabled=True)
    range_key = request.GET.get("range", "15m")
    latency = _viewer_latency(request, rig)
    figures = plotting.dashboard_figures(selectors.rig_series(rig, _range_s(request)), latency)
    config = {
        "rig": rig.pk, "range": range_key, "figures": figures,
        "latest": _viewer_sample(request, selectors.rig_latest(rig)), "speculative": latency["speculative"],
    }  # fmt: skip
    # A short wait: the page must not hang on a broker that does not answer (monitoring.queues caches it).
    queue = rig_consumers([rig], consumers(timeout_s=0.5))[rig.name]
    context = {"rig": rig, "ranges": list(selectors.RANGES_S), "range": range_key, "page_config": config}
    return render(request, "monitoring/rig.html", {**context, "queue": queue})


@login_required
@require_GET
def api_rig_series(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = get_object_or_404(Rig, pk=rig_id, enabled=True)
    columns = selectors.rig_series(rig, _range_s(request))
    figures = plotting.rig_series_figures(columns)
    return FastJsonResponse({"rig": rig.pk, "columns": columns, "figures": figures})


@login_required
@require_GET
def api_rig_latency(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = get_object_or_404(Rig, pk=rig_id, enabled=True)
    latency = _viewer_latency(request, rig)
    return FastJsonResponse({"rig": rig.pk, "latency": latency, "figures": plotting.latency_figures(latency)})


def _metrics_allowed(request: HttpRequest) -> bool:
    token = settings.RIGDASH.metrics_token
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode()):
        return True
    return is_staff(request.user)


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape target. It names users and models: a bearer token (RIGDASH_METRICS_TOKEN) or an
    admin session is required."""
    from monitoring import prometheus

    if not _metrics_allowed(request):
        response = HttpResponse("Authentication required: Authorization: Bearer <RIGDASH_METRICS_TOKEN>\n",
                                status=401, content_type="text/plain")  # fmt: skip
        response["WWW-Authenticate"] = 'Bearer realm="rigdash-metrics"'
        return response
    return HttpResponse(prometheus.render(), content_type=prometheus.CONTENT_TYPE)
