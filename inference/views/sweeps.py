"""Decode sweeps' actions and export (staff only; 404 for everyone else): start, cancel, the CSV of a sweep's points.
The sweep's page is monitoring's (monitoring/sweep_views.py), beside the calculator's prediction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from inference.board import sweeps
from inference.turns import sweep_rows
from inference.views.http import api_view, json_body
from rigdash.access import is_staff

CONFLICTS = {"sweep_running": 409, "rig_busy": 409, "sweep_finished": 409, "rig_unreachable": 503}


@api_view(staff=True, statuses=CONFLICTS)
@require_POST
def api_sweep_start(request: HttpRequest) -> HttpResponse:
    """JSON ``{rig, model, contexts, sessions, max_tokens, force}`` (or the same as a form): 201 and the sweep's
    page, or 400/409 saying what is wrong, with nothing started."""
    body = json_body(request) if request.content_type == "application/json" else request.POST.dict()
    sweep = sweeps.sweep_start(actor=request.user, rig_id=body.get("rig"), raw=body)
    snapshot = sweep_rows.sweep_snapshot(sweep, points=False)
    return JsonResponse({"sweep": snapshot, "url": reverse("monitoring:sweep", args=[sweep.pk])}, status=201)


@api_view(staff=True, statuses=CONFLICTS)
@require_POST
def api_sweep_cancel(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = sweeps.sweep_cancel(actor=request.user, sweep_id=sweep_id)
    return JsonResponse({"sweep": sweep_rows.sweep_snapshot(sweep, points=False)}, status=202)


@login_required
@require_GET
def sweep_csv(request: HttpRequest, sweep_id: int) -> StreamingHttpResponse:
    """The sweep's points as CSV, streamed a chunk of rows at a time (under ASGI through an async iterator: Django
    reads a sync one whole before sending it)."""
    if not is_staff(request.user):
        raise Http404("No such page")
    sweep = sweep_rows.sweep_get(sweep_id)
    if sweep is None:
        raise Http404("No such sweep")
    chunks = sweep_rows.sweep_csv_chunks(sweep)
    content = _async_chunks(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="rigdash-sweep-{sweep.pk}.csv"'
    return response


async def _async_chunks(chunks: Iterator[str]) -> AsyncIterator[str]:
    while (text := await sync_to_async(_next)(chunks)) is not None:
        yield text


def _next(chunks: Iterator[str]) -> str | None:
    return next(chunks, None)
